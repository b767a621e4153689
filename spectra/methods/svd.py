"""`svd`: the best rank-k approximation P_k of P (truncated SVD), the Eckart–Young floor.

P̃ = P_k = U_k Σ_k V_kᵀ, the head output P_k V. No matrix of rank ≤ k is closer to P in Frobenius or
spectral norm; it is an O(n³) per-sequence oracle that no efficient attention can run, the reference
the other methods are measured against.
"""

from __future__ import annotations

from .base import Approximation, Layer, method


@method("svd", color="black", marker="s")
def svd(x: Layer, budget: int) -> Approximation:
    u, sigma, vh = x.svd()
    p_k = (u[..., :budget] * sigma[..., None, :budget]) @ vh[..., :budget, :]
    return Approximation(p_k @ x.v, p_k)
