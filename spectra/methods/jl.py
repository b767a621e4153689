"""`jl`: Theorem 1's P̃ = P Rᵀ R with a seeded R ∈ R^{k×n} (Gaussian N(0, 1/k) or scaled orthonormal rows).

R is drawn per sequence (or once per run with `--fixed-projection`), per (seed, budget, layer, head), and its
padded columns are zeroed, so padding never mixes in. Cost O(n² k) per head: it needs P, so it shows what
Theorem 1 promises, not a fast attention.
"""

from __future__ import annotations

from .base import Approximation, Draws, Layer, Method, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 20


@register
class JL(Method):
    """P̃ = P Rᵀ R with the draws' seeded R, padded columns dropped."""

    random = True
    variants = {"jl": {"color": "tab:orange", "marker": "o"}}

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        r = draws.matrix(x, budget) * x.valid[:, None, None, :]  # (B, H, k, n): padded columns never mix in
        p_tilde = (x.p @ r.transpose(-1, -2)) @ r
        return Approximation(p_tilde @ x.v, p_tilde)
