"""`pool-mean`, `pool-max`: the paper's "general projections" — keys and values pooled over k windows.

The m valid positions are split into k contiguous windows of ⌊m/k⌋ or ⌈m/k⌉ tokens; a pooled key is
weighted by its window size (a log|W| term in the logits), so uneven windows are not biased and k = n
is exact. Mean pooling is linear, an eq. 7 projection with E = F = M (the mean-pooling matrix), so its
P̃ = softmax(Q K̄ᵀ s + log|W|) M exists; max pooling is not linear and has no P̃. Cost O(n k d) per head.
"""

from __future__ import annotations

import torch

from ..kernels import scores
from .base import Approximation, Draws, Layer, Method, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 40


def windows(valid: torch.Tensor, budget: int) -> torch.Tensor:
    """Window id (B, n) of every position: ⌊rank·k/m⌋ over the m valid positions; padding goes to id k."""
    rank = valid.long().cumsum(-1) - 1
    m = valid.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(valid, torch.div(rank * budget, m, rounding_mode="floor"), budget)


def pool(x: torch.Tensor, window: torch.Tensor, budget: int, reduce: str) -> torch.Tensor:
    """Reduce x (B, H, n, d) over windows → (B, H, budget, d) (the padding bucket dropped)."""
    index = window[:, None, :, None].expand_as(x)
    shape = (*x.shape[:2], budget + 1, x.shape[-1])
    return x.new_zeros(shape).scatter_reduce(-2, index, x, reduce=reduce, include_self=False)[..., :budget, :]


def pooled_attention(x: Layer, budget: int, reduce: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax weights over pooled keys (B, H, n, k), pooled values, and window ids."""
    window = windows(x.valid, budget)
    sizes = x.q.new_zeros(window.shape[0], budget + 1).scatter_add(
        -1, window, torch.ones_like(window, dtype=x.q.dtype))[:, :budget]
    k_bar, v_bar = pool(x.k, window, budget, reduce), pool(x.v, window, budget, reduce)
    logits = scores(x.q, k_bar, x.scaling) + sizes.log()[:, None, None, :]
    return torch.softmax(logits, dim=-1), v_bar, window


def mean_pooling_matrix(window: torch.Tensor, budget: int, dtype: torch.dtype) -> torch.Tensor:
    """M (B, k, n): row c averages the positions of window c (the padding bucket dropped)."""
    member = torch.nn.functional.one_hot(window, budget + 1)[..., :budget].to(dtype)  # (B, n, k)
    return (member / member.sum(1, keepdim=True).clamp_min(1)).transpose(-1, -2)


@register
class Pooling(Method):
    """Keys and values pooled over k windows by `reduce`: "mean" (linear: P̃ = softmax(Q K̄ᵀ s + log|W|) M) or
    "amax" (no P̃)."""

    variants = {"pool-mean": {"reduce": "mean", "color": "#e6ab02", "marker": "X", "short": "pool\nmean"},
                "pool-max": {"reduce": "amax", "color": "tab:olive", "marker": "*", "short": "pool\nmax"}}

    def __init__(self, label: str, reduce: str, **shown: str) -> None:
        super().__init__(label, **shown)
        self.reduce = reduce

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        p_bar, v_bar, window = pooled_attention(x, budget, self.reduce)
        if self.reduce != "mean":
            return Approximation(p_bar @ v_bar, None)
        p_tilde = p_bar @ mean_pooling_matrix(window, budget, x.q.dtype)[:, None]
        return Approximation(p_tilde @ x.v, p_tilde)
