"""`linformer` against numpy: E·K and F·V with E, F the context's signed top left singular vectors, the rows
capped at the keys' rank, and the continuation's attention over them as eq. 7 writes it."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from spectra.kv import continuation
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.linformer import signed_left

from .conftest import make_prefill


def numpy_mix(x: np.ndarray, rows: int) -> np.ndarray:
    """√(m/L) Σ_m V_mᵀ per head, each singular pair signed so that its left vector sums to ≥ 0."""
    mixed = []
    for head in x:
        u, sigma, vt = np.linalg.svd(head, full_matrices=False)
        sign = np.where(u[:, :rows].sum(0) < 0, -1.0, 1.0)
        mixed.append(np.sqrt(rows / head.shape[0]) * (sign * sigma[:rows])[:, None] * vt[:rows])
    return np.stack(mixed)


def test_rows_are_the_signed_singular_mixtures() -> None:
    prefill, arrays = make_prefill(length=40)
    got = REGISTRY["linformer"].compress(prefill, 0.9)  # n_kept(40, 0.9) = int(3.99…) = 3 rows
    assert got.kept is None and got.key.shape == (2, 3, 8) and got.saved == 1 - 3 / 40
    np.testing.assert_allclose(got.key.numpy(), numpy_mix(arrays["k"], 3), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(got.value.numpy(), numpy_mix(arrays["v"], 3), rtol=1e-9, atol=1e-10)
    e = signed_left(torch.from_numpy(arrays["k"]), 3).numpy()
    np.testing.assert_allclose(e @ e.transpose(0, 2, 1), np.broadcast_to(np.eye(3), (2, 3, 3)), atol=1e-12)
    assert (e.sum(-1) >= 0).all()
    sigma = np.linalg.svd(arrays["k"], compute_uv=False)
    np.testing.assert_allclose((got.key.numpy() ** 2).sum((1, 2)) / 3, (sigma[:, :3] ** 2).sum(-1) / 40, rtol=1e-9)
    flipped = REGISTRY["linformer"].compress(dataclasses.replace(prefill, key=-prefill.key), 0.9)
    np.testing.assert_allclose(flipped.key.numpy(), -got.key.numpy(), atol=1e-10)  # the sign follows the data


def test_rows_are_capped_at_the_rank_of_the_keys() -> None:
    prefill, _ = make_prefill(length=40)
    assert n_kept(40, 0.5) == 20
    got = REGISTRY["linformer"].compress(prefill, 0.5)
    assert got.key.shape == (2, 8, 8) and got.saved == 1 - 8 / 40


def test_the_continuation_attends_to_the_mixed_rows_as_eq7_says() -> None:
    prefill, arrays = make_prefill(length=40)
    got = REGISTRY["linformer"].compress(prefill, 0.9)
    rng = np.random.default_rng(9)
    q, k, v = rng.standard_normal((6, 3, 8)), rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    out = continuation.cached_attention(torch.from_numpy(q)[None], continuation.stack([got], prefill.key, prefill.value),
                         torch.from_numpy(k)[None], torch.from_numpy(v)[None], prefill.scaling)[0].numpy()
    ek, fv = numpy_mix(arrays["k"], 3), numpy_mix(arrays["v"], 3)
    for head in range(6):
        kv = head // 3
        for i in range(3):
            keys = np.concatenate([ek[kv], k[kv, : i + 1]])
            values = np.concatenate([fv[kv], v[kv, : i + 1]])
            logits = keys @ q[head, i] * prefill.scaling
            weights = np.exp(logits - logits.max())
            np.testing.assert_allclose(out[head, i], weights / weights.sum() @ values, rtol=1e-9, atol=1e-12)
