"""`leverage`: keep the keys with the largest leverage scores in their top principal subspace — the outliers of the
context's key cloud, the rows a low-rank sketch of K cannot do without.

Per key/value head, the context's keys before RoPE (after it for models without RoPE) are centred over the L
tokens, X = K − 1μᵀ (L × d), and factored exactly, X = U Σ Vᵀ. The rank r is read off the spectrum: the smallest r
whose top r singular values hold ENERGY of Σσ² (the per-sequence `pca_rank90` of qkv.csv). Token j's score is its
leverage in that subspace, ℓ_j = Σ_{i ≤ r} U_ji² = x_jᵀ V_r Σ_r⁻² V_rᵀ x_j ∈ [0, 1] (Σ_j ℓ_j = r); the top
n_kept are kept per key/value head.

kvpress 0.5.5's LeverageScorePress is the peer: also centred and pre-RoPE, but *sketched* and *ridged* instead of
exact and truncated — Y = X Φ with Φ ~ N(0, 1/48) of shape d × 48 drawn from torch's global generator anew at every
layer, then ℓ_j = y_jᵀ (YᵀY + λI)⁻¹ y_j with λ = 0.01 (raised tenfold while the Cholesky factorisation fails),
z-scored over the whole tensor (which leaves each head's ranking alone). Its scores are ridge leverages of all
(sketched) directions at once, so a key that is large only in low-variance directions counts as much as one large
in the top ones; here the low-variance tail beyond r is cut, and there is no randomness, so the kept set is a
function of the keys alone. With 48 ≥ d and λ → 0 the sketch gives the full-rank leverage (r = d here).
"""

from __future__ import annotations

import torch

from .base import Prefill, ScorerPress, register
from .pca import energy_rank

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 30

#: the share of the centred keys' energy the leverage subspace holds
ENERGY = 0.9


def leverage_scores(keys: torch.Tensor, energy: float = ENERGY) -> torch.Tensor:
    """(H_kv, L) leverage of each row of `keys` (H_kv, L, d) in the top principal subspace of the centred rows
    holding `energy` of their variance; float64."""
    x = keys.to(torch.float64)
    x = x - x.mean(dim=1, keepdim=True)
    u, sigma, _ = torch.linalg.svd(x, full_matrices=False)  # u (H_kv, L, min(L, d))
    rank = energy_rank(sigma.pow(2), energy)  # (H_kv,)
    inside = torch.arange(sigma.shape[-1], device=x.device)[None, :] < rank[:, None]
    return (u.pow(2) * inside[:, None, :]).sum(-1)


@register
class Leverage(ScorerPress):
    """Leverage scores of the centred pre-RoPE keys in their top-r principal subspace (r for ENERGY of the variance),
    computed exactly (see the module docstring for kvpress's sketched version)."""

    name, summary = "leverage", "the keys with the largest leverage in their top principal subspace"
    peer = "LeverageScorePress"  # sketched and ridged there, exact and truncated here (the module docstring)
    rowscorer = True

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        keys = prefill.key_pre if prefill.key_pre is not None else prefill.key
        return leverage_scores(keys)
