"""`window`: StreamingLLM's attention sinks plus a sliding window (Xiao et al. 2024), k keys per query.

With budget k each query keeps s = min(4, ⌊k/4⌋) sink tokens (the first s valid positions, where it may see
them) and the w = k − s other keys nearest to it among those it may see: for a causal layer the w most
recent ones (itself included), for a bidirectional layer the w nearest in position (ties to the earlier).
P̃ is the exact softmax of the model's scores over that set and zero elsewhere, so a query that may see
at most k keys gets its exact row. Cost O(n k d) per head.
"""

from __future__ import annotations

import torch

from ..kernels import masked_softmax, scores
from .base import Approximation, Draws, Layer, Method, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 90

#: at most this many sink tokens (StreamingLLM keeps 4)
SINKS = 4


def sinks(budget: int) -> int:
    """s = min(4, ⌊k/4⌋) sink tokens at budget k."""
    return min(SINKS, budget // 4)


def window_keys(x: Layer, budget: int) -> torch.Tensor:
    """The keys each query keeps (B, 1, n, n): the sinks it may see and the w = k − s nearest other keys
    it may see, nearest by |i − j| with ties to the earlier position (for a causal layer: the most recent)."""
    n, s = x.q.shape[-2], sinks(budget)
    allowed = x.allowed.expand(-1, -1, n, n)  # (B, 1, n, n)
    rank = x.valid.long().cumsum(-1) - 1
    sink = (x.valid & (rank < s))[:, None, None, :]  # the first s valid positions
    position = torch.arange(n, device=x.q.device)
    offset = position[None, :] - position[:, None]  # j − i
    distance = 2 * offset.abs() + (offset > 0).long()  # distinct per row: nearer first, the earlier of a tie first
    candidate = allowed & ~sink
    priority = (-distance.to(x.q.dtype)).masked_fill(~candidate, float("-inf"))
    chosen = priority.topk(min(budget - s, n), dim=-1).indices
    near = torch.zeros_like(candidate).scatter(-1, chosen, True) & candidate
    return (allowed & sink) | near


@register
class Window(Method):
    """StreamingLLM: the exact softmax over the s = min(4, ⌊k/4⌋) first valid keys (attention sinks) and
    the k − s nearest other keys the query may see (`window_keys`); zero elsewhere."""

    causal = True
    variants = {"window": {"color": "#393b79", "marker": "H", "short": "window\n+sinks"}}

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        p_tilde = masked_softmax(scores(x.q, x.k, x.scaling), window_keys(x, budget))
        return Approximation(p_tilde @ x.v, p_tilde)
