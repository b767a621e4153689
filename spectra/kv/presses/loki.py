"""`loki`: SnapKV's eviction with the window's attention scored in a low-dimensional key basis (Loki, Singhania et
al. 2024: approximate q·k in the top principal components of the keys, fitted offline).

Per key/value head a basis P (d × r, r = d·RANK_SHARE, Loki's default d_f = 0.25) holds the top r centred
principal directions of the keys *before RoPE*, fitted on calibration sequences (`calibrate`: float64 sums over
every calibration token, `pca.Moments`); a press that has seen no calibration sequence for a layer fits P on the
context's own pre-RoPE keys instead (an oracle the paper does not have): `spectra cache --fit-samples N`
calibrates on its first N sequences and freezes the basis for the evaluated ones; with N = 0 (the default) every
context takes that oracle. The last w = min(64, L)
context queries then score the L context keys with approximate logits s·(qP)(kP)ᵀ — post-RoPE q and k, as attention
sees them,
projected on the pre-RoPE basis (RoPE rotates channel pairs by position, so the basis is only approximately theirs:
that loss is part of what is measured) — a causal float32 softmax over the L keys, and the approximate attention
rows go through SnapKV exactly as `snapkv` does (mean over the window, average pooling with kernel 5, mean over
each group, the window always kept). `loki` against `snapkv` at the same ratio is the price of scoring in r of the
d dimensions. Loki itself selects per query at every decoding step; a cache compressed once cannot.
"""

from __future__ import annotations

import dataclasses

import torch

from ...kernels import causal_mask, eager_softmax, scores
from .base import WINDOW, Prefill, ScorerPress, register
from .eviction import SnapKV
from .pca import Fit, MomentsCalibrated, principal

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 40

#: the share of the head dimension the scoring basis keeps (Loki's d_f)
RANK_SHARE = 0.25


def basis_rank(head_dim: int) -> int:
    return max(1, int(head_dim * RANK_SHARE))


def approximate_window(prefill: Prefill, basis: torch.Tensor) -> torch.Tensor:
    """(H, w, L): the causal softmax of the last w context queries over the L context keys with logits
    s·(qP)(kP)ᵀ, P = `basis` (H_kv, d, r) of each query head's key/value head."""
    basis = basis.to(prefill.key.dtype)
    keys = (prefill.key @ basis).repeat_interleave(prefill.groups, dim=0)  # (H, L, r)
    queries = prefill.q @ basis.repeat_interleave(prefill.groups, dim=0)  # (H, w, r)
    visible = causal_mask(queries.shape[1], prefill.length, queries.device)
    return eager_softmax(scores(queries, keys, prefill.scaling), visible, prefill.key.dtype)


@register
class Loki(MomentsCalibrated, ScorerPress):
    """SnapKV's scores from rank-r approximate logits in the keys' calibrated principal basis."""

    name, summary = "loki", "snapkv's choice, scored in the keys' top principal components"
    peer = ""
    windowed = True

    def calibrate(self, prefill: Prefill) -> None:
        self.moments.add(prefill.layer, "key_pre", pre_rope(prefill))

    def fit(self, prefill: Prefill) -> Fit:
        """The calibration's statistics for this layer, else the context's own."""
        if self.moments.has(prefill.layer, "key_pre"):
            return self.moments.fit(prefill.layer, "key_pre")
        return Fit.of(pre_rope(prefill))

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        if prefill.length <= WINDOW:
            raise ValueError(f"loki scores like snapkv: it needs more than {WINDOW} context tokens, got "
                             f"{prefill.length}")
        basis = principal(self.fit(prefill), basis_rank(prefill.head_dim))
        approximate = dataclasses.replace(prefill, window_rows=approximate_window(prefill, basis))
        return SnapKV().score(approximate, ratio)


def pre_rope(prefill: Prefill) -> torch.Tensor:
    """The context's keys before RoPE (the cached keys for a model without it)."""
    return prefill.key_pre if prefill.key_pre is not None else prefill.key
