"""`linformer(s)`: eq. 7, softmax(Q (E K)ᵀ · s) (F V), with seeded E, F under sharing s.

With Gaussian projections E, F are exactly the matrices `nn.Projections(init="jl")` holds (`jl_pair`);
with orthogonal ones each head gets its own scaled orthonormal E, and F = E under kv/layerwise sharing.
P̃ = softmax(Q (E K)ᵀ · s) F is n × n, so its distance to P can be measured. Cost O(n k d) per head.
"""

from __future__ import annotations

import torch

from ..config import Projection, Sharing
from ..kernels import eq7
from ..nn.projections import jl_pair
from ..seeds import Domain
from .base import Approximation, Draws, Layer, Method, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 30


def projected(x: Layer, e: torch.Tensor, f: torch.Tensor) -> Approximation:
    """Eq. 7 on layer x with its n × n P̃ (`kernels.eq7`, dense): E, F (H|1, budget, ≥n), or (B, H, budget, ≥n)
    when each sequence has its own; padded keys are zeroed."""
    out, p_tilde = eq7(x.q, x.k, x.v, e, f, x.valid, x.scaling, dense=True)
    return Approximation(out, p_tilde)


@register
class Linformer(Method):
    """Eq. 7 with the seeded E, F of one sharing level (one draw per sequence unless the draws are fixed); one
    variant per sharing level, each with its plot colour, marker and terminal header."""

    family = "linformer"
    random = True
    variants = {
        "linformer(none)": {"sharing": Sharing.NONE, "color": "tab:blue", "marker": "^", "short": "lin\n(none)"},
        "linformer(headwise)": {"sharing": Sharing.HEADWISE, "color": "tab:cyan", "marker": "v",
                                "short": "lin\n(head)"},
        "linformer(kv)": {"sharing": Sharing.KV, "color": "tab:purple", "marker": "D", "short": "lin\n(kv)"},
        "linformer(layerwise)": {"sharing": Sharing.LAYERWISE, "color": "tab:pink", "marker": "P",
                                 "short": "lin\n(layer)"},
    }

    def __init__(self, label: str, sharing: Sharing, **shown: str) -> None:
        super().__init__(label, **shown)
        self.sharing = sharing

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        heads, n = x.q.shape[1], x.q.shape[-2]
        if draws.projection == Projection.GAUSSIAN and draws.fixed:
            e, f = jl_pair(self.sharing, x.layer, heads, budget, n, draws.seed)
        elif draws.projection == Projection.GAUSSIAN:
            pairs = [jl_pair(self.sharing, x.layer, heads, budget, n, seed) for seed in draws.seeds(Domain.LINFORMER)]
            e, f = (torch.stack(part) for part in zip(*pairs))
        else:  # per-head orthogonal E; F = E under kv/layerwise sharing
            e = draws.matrix(x, budget, which=1)
            f = e if self.sharing in (Sharing.KV, Sharing.LAYERWISE) else draws.matrix(x, budget, which=2)
        return projected(x, e, f)
