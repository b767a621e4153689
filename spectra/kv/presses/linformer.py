"""`linformer`: the context's keys and values mixed down to m rows, E·K and F·V — the Linformer paper's projection
(eq. 7) asked of a decoder's cache after an exact prefill.

Per key/value head, E (m × L) holds the top m left singular vectors of the context's cached keys K (L × d,
post-RoPE) and F those of its values V, so E·K = Σ_m V_mᵀ is the best rank-m summary of K's row space (Eckart–Young)
and likewise F·V. Orthonormal E would leave row i of E·K with the norm σ_i, which for the top direction of a
cache whose keys share a large mean is about √L times a key's norm: one mixed row would take all the softmax
mass. So E and F are scaled by √(m/L), which gives the m mixed rows together the energy (m/L)·Σ_{i≤m} σ_i², an
average row as large as an average key or value (Linformer's trained E has no such constraint; its Gaussian
initialisation N(0, 1/m) is √(L/m) per row instead). The continuation's queries attend to those m mixed rows (and
causally to themselves): softmax(q (E K)ᵀ s) (F V). Singular vectors have no sign of their own; each is signed so
that its entries sum to a non-negative number (a mixture that weighs the context positively on balance), which
makes the press a function of the cache. m = kvpress's n_kept(L, ratio), but at most rank K (≤ d): beyond it the extra rows would be zero keys
that still take softmax mass, so they are not stored, and `saved` (1 − m/L) says what the cache saves. The rows are
not context tokens: `kept` is None, and attention mass kept is not defined.
"""

from __future__ import annotations

import math

import torch

from .base import Compressed, Prefill, Press, n_kept, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 60


def signed_left(x: torch.Tensor, rows: int) -> torch.Tensor:
    """E (H_kv, rows, L): the top `rows` left singular vectors of x (H_kv, L, d) as rows, each signed so that its
    entries sum to ≥ 0; float64."""
    u, _, _ = torch.linalg.svd(x.to(torch.float64), full_matrices=False)
    u = u[..., :rows]
    sign = torch.where(u.sum(dim=1, keepdim=True) < 0, -1.0, 1.0).to(u.dtype)
    return (u * sign).transpose(-1, -2)


@register
class LinformerCache(Press):
    """E·K, F·V with E, F the context's own top singular vectors (see the module docstring)."""

    name, summary = "linformer", "keys and values mixed down to their top singular directions: E·K, F·V"
    peer, mixes = "", True
    ratio_means = ("the share of cached rows removed, the rows kept capped at the head dimension (so beyond "
                   "L ≈ d/(1 − r) every ratio keeps d rows)")

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        rows = min(n_kept(prefill.length, ratio), prefill.length, prefill.head_dim)
        scale = math.sqrt(rows / prefill.length)
        e, f = scale * signed_left(prefill.key, rows), scale * signed_left(prefill.value, rows)
        key = (e @ prefill.key.to(torch.float64)).to(prefill.key.dtype)
        value = (f @ prefill.value.to(torch.float64)).to(prefill.value.dtype)
        return Compressed(None, 1 - rows / prefill.length, key=key, value=value)
