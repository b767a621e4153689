"""`linformer(s)`: eq. 7, softmax(Q (E K)ᵀ · s) (F V), with seeded E, F under sharing s.

With Gaussian projections E, F are exactly the matrices `nn.Projections(init="jl")` holds (`jl_pair`);
with orthogonal ones each head gets its own scaled orthonormal E, and F = E under kv/layerwise sharing.
P̃ = softmax(Q (E K)ᵀ · s) F is n × n, so its distance to P can be measured. Cost O(n k d) per head.
"""

from __future__ import annotations

import torch

from ..config import Projection, Sharing
from ..nn.linformer import compress
from ..nn.projections import jl_pair
from ..seeds import Domain
from .base import Approximation, Layer, Method, register

#: plot colour, marker and terminal header of each sharing level
_SHOWN = {
    Sharing.NONE: ("tab:blue", "^", "lin\n(none)"),
    Sharing.HEADWISE: ("tab:cyan", "v", "lin\n(head)"),
    Sharing.KV: ("tab:purple", "D", "lin\n(kv)"),
    Sharing.LAYERWISE: ("tab:pink", "P", "lin\n(layer)"),
}


def eq7(x: Layer, e: torch.Tensor, f: torch.Tensor) -> Approximation:
    """softmax(Q (E K)ᵀ s) (F V) with its n × n P̃ = softmax(Q (E K)ᵀ s) F; E, F (H|1, k_proj, ≥n), or
    (B, H, k_proj, ≥n) when each sequence has its own, sliced to the first n columns; padded keys are zeroed."""
    n = x.q.shape[-2]
    e, f = e[..., :n].to(x.q), f[..., :n].to(x.q)
    if e.dim() == 4:
        k_bar = torch.einsum("bhcn,bhnd->bhcd", e, x.k.masked_fill(~x.valid[:, None, :, None], 0.0))
    else:
        k_bar = compress(x.k, e, x.valid)
    p_bar = torch.softmax(torch.einsum("bhid,bhcd->bhic", x.q, k_bar) * x.scaling, dim=-1)
    p_tilde = p_bar @ (f * x.valid[:, None, None, :])  # (B, H, n, n)
    return Approximation(p_tilde @ x.v, p_tilde)


def linformer_method(sharing: Sharing) -> Method:
    """Eq. 7 with the seeded E, F of one sharing level (one draw per sequence when the layer asks for it)."""

    def linformer(x: Layer, budget: int) -> Approximation:
        heads, n = x.q.shape[1], x.q.shape[-2]
        if x.projection == Projection.GAUSSIAN and not x.per_sequence:
            e, f = jl_pair(sharing, x.layer, heads, budget, n, x.seed)
        elif x.projection == Projection.GAUSSIAN:
            pairs = [jl_pair(sharing, x.layer, heads, budget, n, seed) for seed in x.sequence_seeds(Domain.LINFORMER)]
            e, f = (torch.stack(part) for part in zip(*pairs))
        else:  # per-head orthogonal E; F = E under kv/layerwise sharing
            e = x.random(budget, which=1)
            f = e if sharing in (Sharing.KV, Sharing.LAYERWISE) else x.random(budget, which=2)
        return eq7(x, e, f)

    return linformer


for _sharing, (_color, _marker, _short) in _SHOWN.items():
    register(f"linformer({_sharing})", linformer_method(_sharing), family="linformer", color=_color, marker=_marker,
             short=_short)
