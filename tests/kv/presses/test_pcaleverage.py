"""`pca_leverage` against numpy: the exact leverage of the centred pre-RoPE keys in their top-r principal subspace, r
from the spectrum; which keys it keeps per key/value head."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.pcaleverage import ENERGY, pca_leverage_scores

from .conftest import make_prefill


def numpy_leverage(keys: np.ndarray) -> np.ndarray:
    """Per head: r from the centred singular values, then diag(X V_r Σ_r⁻² V_rᵀ Xᵀ) (a formula without U)."""
    scores = []
    for x in keys:
        x = x - x.mean(0)
        _, sigma, vt = np.linalg.svd(x, full_matrices=False)
        share = np.cumsum(sigma**2) / (sigma**2).sum()
        rank = int(np.searchsorted(share, ENERGY) + 1)
        v = vt[:rank].T
        scores.append(np.einsum("ld,de,le->l", x, v @ np.diag(sigma[:rank] ** -2.0) @ v.T, x))
    return np.stack(scores)


def test_scores_equal_the_projector_diagonal_and_sum_to_the_rank() -> None:
    rng = np.random.default_rng(2)
    keys = rng.standard_normal((2, 50, 8)) @ np.diag([5, 4, 3, 1, 0.5, 0.2, 0.1, 0.05]) + 7.0
    got = pca_leverage_scores(torch.from_numpy(keys)).numpy()
    np.testing.assert_allclose(got, numpy_leverage(keys), rtol=1e-9, atol=1e-12)
    sums = got.sum(-1)
    np.testing.assert_allclose(sums, np.round(sums), atol=1e-9)  # Σ ℓ = r, an integer
    assert (got >= 0).all() and (got <= 1 + 1e-12).all()


def test_the_press_keeps_the_top_leverage_pre_rope_keys_per_head() -> None:
    prefill, _ = make_prefill(length=60)
    rng = np.random.default_rng(5)
    pre = rng.standard_normal((2, 60, 8)) * rng.uniform(0.2, 3.0, (2, 1, 8))
    prefill = dataclasses.replace(prefill, key_pre=torch.from_numpy(pre))
    kept = REGISTRY["pca_leverage"].compress(prefill, 0.5).kept.numpy()
    expected = np.sort(np.argsort(-numpy_leverage(pre), axis=-1, kind="stable")[:, : n_kept(60, 0.5)], axis=-1)
    np.testing.assert_array_equal(kept, expected)
    assert not np.array_equal(kept[0], kept[1])
    without = REGISTRY["pca_leverage"].compress(dataclasses.replace(prefill, key_pre=None), 0.5).kept.numpy()
    assert not np.array_equal(without, kept), "the keys before RoPE, not the cached ones, when given"
