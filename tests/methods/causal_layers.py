"""Helpers of the causal-method tests: layers padded on the left or the right, causal or not, the dense numpy
P they are checked against, and the look-ahead check (does anything after position i change rows ≤ i?)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import torch

from layers import D, H, N, draws, softmax
from spectra.capture import Captured
from spectra.methods import Approximation, Draws, Layer

S = 0.7  # the score scale s


def valid_positions(lengths: Sequence[int], n: int, side: str) -> torch.Tensor:
    """(B, n): each sequence's `length` real tokens, after left padding or before right padding."""
    position = torch.arange(n)[None, :]
    lengths_t = torch.tensor(list(lengths))[:, None]
    return position >= n - lengths_t if side == "left" else position < lengths_t


def model_mask(valid: torch.Tensor, causal: bool, dtype: torch.dtype) -> torch.Tensor:
    """The additive (B, 1, n, n) mask a model would pass: padded keys blocked and, when causal, later keys."""
    n = valid.shape[-1]
    seen = valid[:, None, None, :]
    if causal:
        seen = seen & torch.ones(n, n, dtype=torch.bool).tril()
    return torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)


def layer(lengths: Sequence[int] = (N, 7), side: str = "right", *, causal: bool = True, n: int = N, seed: int = 0,
          spread: float = 1.0, dtype: torch.dtype = torch.float64) -> Layer:
    """A Layer of Gaussian q, k, v (B = len(lengths), H heads, n tokens, D dims) padded on `side`; P computed
    from q and k (as a substitution sees it)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(len(lengths), H, n, D, generator=g, dtype=torch.float64).to(dtype) * spread
               for _ in range(3))
    mask = model_mask(valid_positions(lengths, n, side), causal, dtype)
    return Layer.of(Captured.of(3, q, k, v, mask, S, causal=causal), use_p=False)


def allowed(x: Layer, b: int, i: int) -> list[int]:
    """The positions query i of sequence b may see: valid keys, and for a causal layer those at or before i."""
    n = x.q.shape[-2]
    return [j for j in range(n) if x.valid[b, j] and (j <= i or not x.causal)]


def dense_p(x: Layer, b: int, h: int) -> np.ndarray:
    """P (n, n) of one head recomputed in numpy: the softmax over each query's allowed keys, padded rows and
    columns zero."""
    q, k = x.q[b, h].numpy(), x.k[b, h].numpy()
    n = q.shape[0]
    p = np.zeros((n, n))
    for i in range(n):
        seen = allowed(x, b, i)
        if x.valid[b, i] and seen:
            p[i, seen] = softmax(q[i] @ k[seen].T * x.scaling)
    return p


def valid_rows(x: Layer, b: int) -> np.ndarray:
    return np.flatnonzero(x.valid[b].numpy())


def with_future_changed(x: Layer, i: int, seed: int = 1) -> Layer:
    """x with q, k, v redrawn at every position after i (the valid keys and causality unchanged)."""
    g = torch.Generator().manual_seed(seed)
    later = (torch.arange(x.q.shape[-2]) > i)[None, None, :, None]
    q, k, v = (torch.where(later, torch.randn(t.shape, generator=g, dtype=t.dtype), t) for t in (x.q, x.k, x.v))
    return replace(x, q=q, k=k, v=v * x.valid[:, None, :, None].to(v.dtype), _p=None, _svd=None)


def look_ahead(run: Callable[[Layer, int, Draws], Approximation], x: Layer, budget: int, i: int) -> float:
    """How much rows ≤ i of the output and of P̃ move when everything after position i changes."""
    before, after = run(x, budget, draws(x)), run(with_future_changed(x, i), budget, draws(x))
    moved = (after.out - before.out)[..., :i + 1, :].abs().max()
    if before.p is not None:
        moved = torch.maximum(moved, (after.p - before.p)[..., :i + 1, :].abs().max())
    return float(moved)


__all__ = ["D", "H", "N", "S", "allowed", "dense_p", "layer", "look_ahead", "model_mask", "valid_positions",
           "valid_rows", "with_future_changed"]
