"""The spectrum stage's library calls against scipy in float64: Gram eigenvalues and singular values of full,
wide, tall and strided blocks, the workspace's bounds, and the BLAS thread limit."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from threadpoolctl import threadpool_info

from spectra.lapack import Workspace, one_blas_thread


@pytest.mark.parametrize("shape", [(64, 64), (40, 64), (64, 30), (1, 7), (7, 1), (17, 17)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_eigenvalues_and_singular_values_match_scipy(shape: tuple[int, int], dtype: type) -> None:
    """√eig of the smaller Gram matrix and the SVD's σ equal float64 scipy's σ of the block (squared, within
    the Gram route's rounding: ~u·σ₁² absolute)."""
    block = np.random.default_rng(sum(shape)).random(shape).astype(dtype)
    want = scipy.linalg.svdvals(block.astype(np.float64))
    space = Workspace(64)
    eigenvalues = space.gram_eigenvalues(block).copy()
    assert eigenvalues.shape == (min(shape),) and (np.diff(eigenvalues) >= 0).all()  # ascending
    assert np.abs(eigenvalues[::-1] - want**2).max() <= 64 * np.finfo(np.float64).eps * want[0] ** 2
    sigma = space.singular_values(block).copy()
    assert sigma.shape == (min(shape),) and (np.diff(sigma) <= 0).all()  # descending
    assert np.abs(sigma - want).max() <= 64 * np.finfo(np.float64).eps * want[0]


def test_a_workspace_serves_smaller_and_strided_blocks_and_refuses_larger_ones() -> None:
    space = Workspace(32)
    rng = np.random.default_rng(0)
    for rows, cols in ((32, 32), (5, 9), (32, 3)):
        block = rng.random((rows * 2, cols * 3))[::2, ::3]  # a strided view: copied, not misread
        assert np.allclose(np.sqrt(np.maximum(space.gram_eigenvalues(block)[::-1], 0)),
                           scipy.linalg.svdvals(block), atol=1e-12)
        assert np.allclose(space.singular_values(block), scipy.linalg.svdvals(block), atol=1e-13)
    with pytest.raises(ValueError, match="a 33×2 matrix does not fit a workspace for 32×32"):
        space.gram_eigenvalues(np.ones((33, 2)))


def test_the_blas_runs_one_thread_inside_the_limit_and_returns_to_its_own_count() -> None:
    before = {entry["filepath"]: entry["num_threads"] for entry in threadpool_info() if entry["user_api"] == "blas"}
    assert before, "scipy's BLAS is loaded"
    with one_blas_thread():
        inside = {entry["filepath"]: entry["num_threads"] for entry in threadpool_info() if entry["user_api"] == "blas"}
    after = {entry["filepath"]: entry["num_threads"] for entry in threadpool_info() if entry["user_api"] == "blas"}
    assert set(inside.values()) == {1} and after == before
