"""`leverage` (kvpress 0.5.5's LeverageScorePress; Compactor, Chari & Van Durme 2025, arXiv:2507.08143): keep the
keys that are outliers of the context's key cloud — the largest approximate leverage scores of the pre-RoPE keys.

Per key/value head, the context's L pre-RoPE keys are centred over the tokens and sketched on the right,
X = (K − 1μᵀ)Φ with Φ ~ N(0, 1/SKETCH) of shape d × SKETCH (drawn in the keys' dtype, X taken to float32), and token
j's score is its ridge leverage ℓ_j = x_jᵀ(XᵀX + λI)⁻¹x_j, clamped at 0: a Cholesky factorisation of the symmetrised
Gram matrix with λ = RIDGE, λ raised tenfold while it fails (kvpress's chol_with_jitter, five tries), then a Cholesky
solve. The scores are z-scored over the whole layer (every head; the unbiased standard deviation floored at 1e-6),
which keeps each head's order, and the top n_kept are kept per key/value head.

kvpress draws Φ from torch's global generator at every layer (one draw of shape (1, H_kv, d, SKETCH) a layer). Here
Φ comes from a CPU generator seeded by (run seed, sequence index) and advanced layer by layer — layer ℓ's Φ is its
(ℓ + 1)-th draw — which is what kvpress draws when torch.manual_seed(`Leverage.seed_of(seed, index)`) precedes the
prefill. `compactor` blends this leverage (on the tokens between its sinks) with a non-causal attention and draws
its sketches from the same seed: kvpress's CompactorPress draws them through a LeverageScorePress.

It is no row scorer: chunk(…) and block(…) would score a layer several times, and kvpress would draw a fresh Φ from
the global generator at each call. `pca_leverage` is spectra's exact, truncated variant, without randomness.
"""

from __future__ import annotations

import math

import torch

from ...seeds import Domain, derive_seed
from .base import Prefill, ScorerPress, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 31

#: kvpress's defaults: the sketch's width, and the ridge its Cholesky factorisation starts from
SKETCH, RIDGE = 48, 1e-2


def sketched_leverage(key_pre: torch.Tensor, sketch: torch.Tensor, ridge: float = RIDGE) -> torch.Tensor:
    """(H_kv, S) ridge leverage x_jᵀ(XᵀX + λI)⁻¹x_j of the centred keys `key_pre` (H_kv, S, d) sketched by `sketch`
    (H_kv, d, k), X in float32; λ = `ridge`, raised tenfold while the Cholesky factorisation fails (kvpress's
    chol_with_jitter: five tries)."""
    x = ((key_pre - key_pre.mean(dim=-2, keepdim=True)) @ sketch).to(torch.float32)
    gram = x.transpose(-1, -2) @ x
    gram = (gram + gram.transpose(-1, -2)) / 2
    identity = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    for _ in range(5):
        factor, info = torch.linalg.cholesky_ex(gram + ridge * identity)
        if bool((info == 0).all()):
            break
        ridge = max(1e-8, 10.0 * ridge)
    else:
        raise ValueError("leverage: the sketched keys' Gram matrix is not positive definite")
    solved = torch.cholesky_solve(x.transpose(-1, -2), factor)  # (H_kv, k, S)
    return (x * solved.transpose(-1, -2)).sum(dim=-1).clamp_min(0)


def z_scored(scores: torch.Tensor) -> torch.Tensor:
    """Scores centred and scaled over the whole tensor (every head): (s − mean) / max(std, 1e-6), std unbiased."""
    return (scores - scores.mean()) / scores.std().clamp_min(1e-6)


def sketches(seed: int, layer: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Layer `layer`'s Gaussian sketch N(0, 1/k) of `shape` (…, d, k): the (layer + 1)-th draw of that shape from a CPU
    generator seeded `seed` (what torch's global generator, so seeded, gives the layer-by-layer draws of a prefill)."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(layer + 1):
        draw = torch.randn(shape, generator=generator, dtype=dtype)
    return draw * (1 / math.sqrt(shape[-1]))


def layer_sketch(prefill: Prefill) -> torch.Tensor:
    """(H_kv, d, SKETCH) the sketch of this prefill's layer, on the keys' device: the draw kvpress's
    LeverageScorePress makes at that layer after torch.manual_seed(`Leverage.seed_of(seed, index)`)."""
    shape = (1, prefill.kv_heads, prefill.head_dim, SKETCH)
    seed = Leverage.seed_of(prefill.seed, prefill.index)
    return sketches(seed, prefill.layer, shape, prefill.key.dtype)[0].to(prefill.key.device)


@register
class Leverage(ScorerPress):
    """kvpress's LeverageScorePress: the z-scored sketched ridge leverage of the centred pre-RoPE keys (see the module
    docstring)."""

    name, summary = "leverage", "the keys with the largest sketched leverage (outliers of the key cloud)"
    peer = "LeverageScorePress"

    @staticmethod
    def seed_of(seed: int, index: int) -> int:
        """The seed of sequence `index`'s sketches in a run seeded `seed` (torch.manual_seed's for kvpress), shared
        with compactor's leverage."""
        return derive_seed(seed, Domain.LEVERAGE_SKETCH, index)

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        keys = prefill.key_pre if prefill.key_pre is not None else prefill.key
        return z_scored(sketched_leverage(keys, layer_sketch(prefill)))
