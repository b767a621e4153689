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
from .base import Approximation, Layer, Method, register

#: plot colour, marker and terminal header of each sharing level
_SHOWN = {
    Sharing.NONE: ("tab:blue", "^", "lin\n(none)"),
    Sharing.HEADWISE: ("tab:cyan", "v", "lin\n(head)"),
    Sharing.KV: ("tab:purple", "D", "lin\n(kv)"),
    Sharing.LAYERWISE: ("tab:pink", "P", "lin\n(layer)"),
}


def linformer_method(sharing: Sharing) -> Method:
    """Eq. 7 with the seeded E, F of one sharing level."""

    def linformer(x: Layer, budget: int) -> Approximation:
        heads, n = x.q.shape[1], x.q.shape[-2]
        if x.projection == Projection.GAUSSIAN:
            e, f = jl_pair(sharing, x.layer, heads, budget, n, x.seed)
        else:  # per-head orthogonal E; F = E under kv/layerwise sharing
            e = x.random(budget, which=1)
            f = e if sharing in (Sharing.KV, Sharing.LAYERWISE) else x.random(budget, which=2)
        e, f = e.to(x.q), f.to(x.q)
        k_bar = compress(x.k, e, x.valid)
        p_bar = torch.softmax(torch.einsum("bhid,bhcd->bhic", x.q, k_bar) * x.scaling, dim=-1)
        p_tilde = p_bar @ (f[..., :n] * x.valid[:, None, None, :])  # (B, H, n, n)
        return Approximation(p_tilde @ x.v, p_tilde)

    return linformer


for _sharing, (_color, _marker, _short) in _SHOWN.items():
    register(f"linformer({_sharing})", linformer_method(_sharing), family="linformer", color=_color, marker=_marker,
             short=_short)
