"""`svd`: the best rank-k approximation P_k of P (truncated SVD), the Eckart–Young floor.

P̃ = P_k = U_k Σ_k V_kᵀ, the head output P_k V. No matrix of rank ≤ k is closer to P in Frobenius or
spectral norm; it is an O(n³) per-sequence oracle that no efficient attention can run, the reference
the other methods are measured against.

`svd-causal`: its causal counterpart. Row i of P̃ is row i of the best rank-k approximation of the prefix
block P[:i+1, :i+1] (the rows and columns the queries up to i see), so it depends on nothing after i.
The truncated SVD of the whole causal P, causal mask re-applied, would not be causal: its basis comes from
every row, so later queries and keys change an earlier row's approximation. One SVD per prefix: O(n⁴/4)
per head, an oracle for n ≤ 256 or so.
"""

from __future__ import annotations

import torch

from ..spectrum import split_threads
from .base import Approximation, Draws, Layer, Method, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 10


def truncated(x: Layer, budget: int) -> Approximation:
    """P_k = U_k Σ_k V_kᵀ and P_k V."""
    u, sigma, vh = x.svd()
    p_k = (u[..., :budget] * sigma[..., None, :budget]) @ vh[..., :budget, :]
    return Approximation(p_k @ x.v, p_k)


def prefix_truncations(p: torch.Tensor, budget: int) -> torch.Tensor:
    """P̃ (b, n, n) for p (b, n, n): row i is row i of the rank-k truncated SVD of p[:, :i+1, :i+1]. Rows
    i < k are p's own (a block of i + 1 ≤ k rows has rank ≤ k)."""
    n = p.shape[-1]
    rows = torch.zeros_like(p)
    rows[:, :budget] = p[:, :budget]
    for i in range(budget, n):
        u, sigma, vh = torch.linalg.svd(p[:, :i + 1, :i + 1], full_matrices=False)
        rows[:, i, :i + 1] = ((u[:, i, None, :budget] * sigma[:, None, :budget]) @ vh[:, :budget, :])[:, 0]
    return rows


@register
class TruncatedSVD(Method):
    """The truncated SVD of P (`svd`), or with `causal` of each prefix block (`svd-causal`): row i of P̃ = row i
    of the best rank-k approximation (Eckart–Young) of P[:i+1, :i+1] on a causal layer (`prefix_truncations`);
    on a bidirectional layer every query sees the whole P and this is `svd`. Exact for the first k valid rows
    and for k ≥ n."""

    variants = {"svd": {"causal": False, "color": "black", "marker": "s"},
                "svd-causal": {"causal": True, "color": "#7b4173", "marker": "+", "short": "svd\ncausal"}}

    def __init__(self, label: str, *, causal: bool, **shown: str) -> None:
        super().__init__(label, **shown)
        self.causal = causal

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        if not (self.causal and x.causal):
            return truncated(x, budget)
        p = x.p
        parts = split_threads(lambda chunk: prefix_truncations(chunk, budget), p)
        p_tilde = torch.cat(parts).reshape(p.shape)
        return Approximation(p_tilde @ x.v, p_tilde)
