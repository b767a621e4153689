"""`pca_leverage` (spectra's own): keep the keys with the largest *exact* leverage scores in their top principal
subspace — the outliers of the context's key cloud, the rows a low-rank sketch of K cannot do without.

Per key/value head, the context's keys before RoPE (after it for models without RoPE) are centred over the L
tokens, X = K − 1μᵀ (L × d), and factored exactly, X = U Σ Vᵀ. The rank r is read off the spectrum: the smallest r
whose top r singular values hold ENERGY of Σσ² (the per-sequence `pca_rank90` of qkv.csv). Token j's score is its
leverage in that subspace, ℓ_j = Σ_{i ≤ r} U_ji² = x_jᵀ V_r Σ_r⁻² V_rᵀ x_j ∈ [0, 1] (Σ_j ℓ_j = r); the top
n_kept are kept per key/value head.

How it differs from `leverage` (kvpress 0.5.5's LeverageScorePress, which it is not equal to): that press is
*sketched* and *ridged* — Y = X Φ with a random Gaussian Φ of d × 48 drawn anew at every layer, then
ℓ_j = y_jᵀ(YᵀY + λI)⁻¹y_j with λ = 0.01, z-scored — so its scores are ridge leverages of all (sketched) directions
at once, and a key large only in low-variance directions counts as much as one large in the top ones; here the
low-variance tail beyond r is cut, and there is no randomness, so the kept set is a function of the keys alone
(and a row scorer: chunk(…) and block(…) take it). With 48 ≥ d and λ → 0 the sketch gives the full-rank leverage
(r = d here).
"""

from __future__ import annotations

import torch

from .base import Prefill, ScorerPress, register
from .pca import energy_rank

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 30

#: the share of the centred keys' energy the leverage subspace holds
ENERGY = 0.9


def pca_leverage_scores(keys: torch.Tensor, energy: float = ENERGY) -> torch.Tensor:
    """(H_kv, L) leverage of each row of `keys` (H_kv, L, d) in the top principal subspace of the centred rows
    holding `energy` of their variance; float64."""
    x = keys.to(torch.float64)
    x = x - x.mean(dim=1, keepdim=True)
    u, sigma, _ = torch.linalg.svd(x, full_matrices=False)  # u (H_kv, L, min(L, d))
    rank = energy_rank(sigma.pow(2), energy)  # (H_kv,)
    inside = torch.arange(sigma.shape[-1], device=x.device)[None, :] < rank[:, None]
    return (u.pow(2) * inside[:, None, :]).sum(-1)


@register
class PcaLeverage(ScorerPress):
    """spectra's exact leverage: the leverage of the centred pre-RoPE keys in their top-r principal subspace (r for
    ENERGY of the variance), no sketch, no ridge (see the module docstring for how kvpress's `leverage` differs)."""

    name, summary = "pca_leverage", "the keys with the largest exact leverage in their top principal subspace"
    peer = ""  # spectra's own: kvpress's LeverageScorePress (spectra's `leverage`) is sketched and ridged
    rowscorer = True

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        keys = prefill.key_pre if prefill.key_pre is not None else prefill.key
        return pca_leverage_scores(keys)
