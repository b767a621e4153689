"""A synthetic prefill for the press tests: random post-RoPE q, k, v with 6 query heads over 2 key/value heads, and
the causal attention rows computed here in float64 (numpy), independently of spectra's capture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.kv.presses import Prefill
from spectra.kv.presses.base import WINDOW

HEADS, KV_HEADS, DIM = 6, 2, 8


def causal_p(q: np.ndarray, k: np.ndarray, scaling: float) -> np.ndarray:
    """softmax(q kᵀ s) with causal masking, (H, L, L), keys repeated to the query heads."""
    keys = np.repeat(k, q.shape[0] // k.shape[0], axis=0)
    scores = np.einsum("hid,hjd->hij", q, keys) * scaling
    length = q.shape[1]
    scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    return weights / weights.sum(-1, keepdims=True)


def make_prefill(length: int = 100, seed: int = 0, index: int = 3, run_seed: int = 7) -> tuple[Prefill, dict]:
    """A Prefill of `length` tokens and the numpy arrays it was made from (q_all, k, v, p)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((HEADS, length, DIM))
    k = rng.standard_normal((KV_HEADS, length, DIM)) * rng.uniform(0.5, 2.0, (KV_HEADS, length, 1))
    v = rng.standard_normal((KV_HEADS, length, DIM))
    scaling = DIM ** -0.5
    p = causal_p(q, k, scaling)
    window = min(WINDOW, length)
    as_torch = lambda array: torch.from_numpy(np.ascontiguousarray(array))  # noqa: E731
    prefill = Prefill(0, as_torch(q[:, -window:]), as_torch(k), as_torch(v), None, as_torch(p[:, -window:]), scaling,
                      run_seed, index, passes={"received": as_torch(p.sum(1))})
    return prefill, {"q": q, "k": k, "v": v, "p": p}


@pytest.fixture
def prefill() -> tuple[Prefill, dict]:
    return make_prefill()
