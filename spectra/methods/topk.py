"""`topk`: the sparse oracle — each query keeps its k highest-scoring keys and the softmax over them.

P̃_i = softmax over the k keys j the query may see with the largest scores s q_i·k_j (ties to the earlier
position), zero elsewhere: the best k-sparse support of each row, the sparse counterpart of the truncated
SVD. It needs every score, so like `svd` it is an oracle, not a fast attention: O(n² d) per head (plus the
selection), a query that may see at most k keys gets its exact row.
"""

from __future__ import annotations

import torch

from ..kernels import masked_softmax, scores
from .base import Approximation, Draws, Layer, Method, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 100


def top_keys(x: Layer, s: torch.Tensor, budget: int) -> torch.Tensor:
    """The keys each query keeps (B, H, n, n) given the scores s (B, H, n, n): its k highest-scoring
    allowed keys, ties to the earlier position. Every key above the k-th largest score t_i, then the
    earliest keys scoring exactly t_i until k are kept (no full sort; fewer than k allowed keys: all)."""
    allowed = x.allowed
    s = s.masked_fill(~allowed, float("-inf"))
    t = s.topk(min(budget, s.shape[-1]), dim=-1).values[..., -1:]  # the k-th largest score of each row
    above = s > t
    tie = (s == t) & allowed
    room = budget - above.sum(-1, keepdim=True, dtype=torch.int32)
    return above | (tie & (tie.cumsum(-1, dtype=torch.int32) <= room))


@register
class TopK(Method):
    """The softmax of the model's scores over each query's k highest-scoring allowed keys; zero elsewhere."""

    causal = True
    variants = {"topk": {"color": "#8c6d31", "marker": "8", "short": "top-k\noracle"}}

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        s = scores(x.q, x.k, x.scaling)
        p_tilde = masked_softmax(s, top_keys(x, s, budget))
        return Approximation(p_tilde @ x.v, p_tilde)
