"""`loki` against numpy: SnapKV's formula applied to the window's attention with logits s·(qP)(kP)ᵀ, P the top
centred principal directions of the pre-RoPE keys — fitted on calibration sequences, else on the context."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.kv.presses import n_kept
from spectra.kv.presses.eviction import KERNEL
from spectra.kv.presses.loki import Loki, basis_rank

from .conftest import make_prefill

LENGTH, WINDOW = 120, 64


def top_directions(rows: np.ndarray, rank: int) -> np.ndarray:
    """(H_kv, d, rank): the top eigenvectors of each head's biased covariance of `rows` (H_kv, N, d)."""
    bases = []
    for x in rows:
        _, vectors = np.linalg.eigh(np.cov(x, rowvar=False, bias=True))
        bases.append(vectors[:, ::-1][:, :rank])
    return np.stack(bases)


def numpy_scores(arrays: dict, basis: np.ndarray) -> np.ndarray:
    """SnapKV's scores (H_kv, L) from the approximate attention of the last WINDOW queries."""
    q, k = arrays["q"][:, -WINDOW:], arrays["k"]
    p_of_head = np.repeat(basis, 3, axis=0)
    logits = np.einsum("hwr,hlr->hwl", q @ p_of_head, np.repeat(k, 3, axis=0) @ p_of_head) * 8 ** -0.5
    position = np.arange(LENGTH - WINDOW, LENGTH)[:, None]
    logits = np.where(np.arange(LENGTH)[None, :] <= position, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mean = weights[:, :, : LENGTH - WINDOW].mean(1)
    padded = np.pad(mean, ((0, 0), (KERNEL // 2, KERNEL // 2)))
    pooled = np.stack([padded[:, j: j + KERNEL].mean(-1) for j in range(LENGTH - WINDOW)], axis=-1)
    return pooled.reshape(2, 3, -1).mean(1)


def kept_of(scores: np.ndarray, ratio: float) -> np.ndarray:
    count = n_kept(LENGTH, ratio) - WINDOW
    chosen = np.sort(np.argsort(-scores, axis=-1, kind="stable")[:, :count], axis=-1)
    return np.concatenate([chosen, np.tile(np.arange(LENGTH - WINDOW, LENGTH), (2, 1))], axis=1)


def with_pre_rope(seed: int) -> tuple:
    prefill, arrays = make_prefill(length=LENGTH, seed=seed)
    rng = np.random.default_rng(seed + 100)
    pre = rng.standard_normal((2, LENGTH, 8)) * np.array([3, 2, 1.5, 1, 0.5, 0.3, 0.2, 0.1]) + rng.standard_normal(8)
    return dataclasses.replace(prefill, key_pre=torch.from_numpy(pre)), arrays, pre


def test_uncalibrated_loki_scores_in_the_contexts_own_basis() -> None:
    prefill, arrays, pre = with_pre_rope(0)
    press = Loki()
    rank = basis_rank(8)
    assert rank == 2
    expected = numpy_scores(arrays, top_directions(pre, rank))
    got = press.score(prefill, 0.25).numpy()[:, : LENGTH - WINDOW]
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-14)
    np.testing.assert_array_equal(press.compress(prefill, 0.25).kept.numpy(), kept_of(expected, 0.25))


def test_calibrated_loki_uses_the_pooled_calibration_keys() -> None:
    press = Loki()
    calibration = [with_pre_rope(seed)[0] for seed in (1, 2)]
    for prefill in calibration:
        press.calibrate(prefill)
    pooled = np.concatenate([prefill.key_pre.numpy() for prefill in calibration], axis=1)
    prefill, arrays, own = with_pre_rope(0)
    expected = numpy_scores(arrays, top_directions(pooled, 2))
    np.testing.assert_allclose(press.score(prefill, 0.5).numpy()[:, : LENGTH - WINDOW], expected, rtol=1e-9,
                               atol=1e-14)
    assert not np.allclose(expected, numpy_scores(arrays, top_directions(own, 2))), "the basis matters"
    other_layer = dataclasses.replace(prefill, layer=1)
    np.testing.assert_allclose(press.score(other_layer, 0.5).numpy()[:, : LENGTH - WINDOW],
                               numpy_scores(arrays, top_directions(own, 2)), rtol=1e-9, atol=1e-14)
    press.clear()
    np.testing.assert_allclose(press.score(prefill, 0.5).numpy()[:, : LENGTH - WINDOW],
                               numpy_scores(arrays, top_directions(own, 2)), rtol=1e-9, atol=1e-14)


def test_a_full_rank_basis_is_snapkv() -> None:
    prefill, _, _ = with_pre_rope(3)
    press = Loki()
    full_basis = torch.eye(8, dtype=torch.float64).expand(2, 8, 8)
    from spectra.kv.presses.eviction import SnapKV
    from spectra.kv.presses.loki import approximate_window

    approximate = dataclasses.replace(prefill, window_rows=approximate_window(prefill, full_basis))
    np.testing.assert_allclose(approximate.window.numpy(), prefill.window.numpy(), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(SnapKV().score(approximate, 0.5).numpy(), SnapKV().score(prefill, 0.5).numpy(),
                               rtol=1e-9, atol=1e-15)
    assert press.name == "loki"


def test_loki_refuses_a_context_no_longer_than_the_window() -> None:
    prefill, _ = make_prefill(length=64)
    with pytest.raises(ValueError, match="loki scores like snapkv: it needs more than 64 context tokens"):
        Loki().compress(prefill, 0.5)
