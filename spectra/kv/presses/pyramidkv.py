"""`pyramidkv` (PyramidKV, Cai et al. 2024, arXiv:2406.02069): SnapKV's scores, with more tokens kept in the lower
layers than in the upper ones — a pyramid of per-layer budgets adding up to about the uniform ratio's.

The paper observes that attention is spread over the whole context in the first layers and funnels onto a few tokens
in the last ones ("pyramidal information funnelling"), so a layer high in the model loses less by keeping fewer
tokens. Each layer ℓ of the N_layers scores its tokens as SnapKV does (the last 64 context queries' attention, pooled,
averaged over each key/value group, the window always kept) and keeps its own n_ℓ best per key/value head.

kvpress 0.5.5's PyramidKVPress (window_size 64, kernel_size 5, beta 20) is the peer, at its defaults. Its budget
(`get_layer_budget`, from KVCache-Factory) at ratio r over L tokens, w = 64, β = 20: C = w + L(1 − r), a ramp from
high = 2(C − w) − (C − w)/β at layer 0 down to low = (C − w)/β at the last layer (high capped at L − w, low raised
to keep the sum), n_ℓ = round(high − ℓ·(high − low)/(N_layers − 1)); where the ramp does not fit (not
L ≥ high ≥ low ≥ w: short contexts, high ratios) every layer keeps max(1, round(L(1 − r))) — round, not int, so
that fallback can keep one token more than SnapKV. The budgets are `schedules.pyramid_kept`, shared with the
`pyramid` schedule of the per-layer study. The kept tokens are listed in position order (kvpress gathers them in
torch.topk's order: the same cache, whose attention does not depend on the order of its rows).

The budget needs the model's layer count, which one layer's `Prefill` does not carry: the run hands it over
(`for_run(layers=…)`, from `kv.cell.Cells`), and the registry's instance, bound to no model, refuses to compress.
"""

from __future__ import annotations

from .base import Compressed, Prefill, evict, register
from .eviction import SnapKV
from .schedules import PYRAMID_BETA, pyramid_kept

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 12


@register
class PyramidKV(SnapKV):
    """PyramidKV: SnapKV's scores, layer ℓ keeping `pyramid_kept(L, r, layers)[ℓ]` tokens per key/value head (see the
    module docstring); `layers` is the model's layer count, given by the run (`for_run`)."""

    name, summary = "pyramidkv", "SnapKV's tokens, more kept in the lower layers: a pyramid of budgets"
    peer = "PyramidKVPress"
    scorer = False  # its budget is its own: a wrapper taking a scorer (adakv) would drop the pyramid

    def __init__(self, layers: int | None = None) -> None:
        if layers is not None and layers < 1:
            raise ValueError(f"pyramidkv needs a positive layer count, got {layers}")
        self.layers = layers

    def fresh(self) -> PyramidKV:
        return PyramidKV(self.layers)

    def for_run(self, layers: int | None = None, **settings: object) -> PyramidKV:
        """This press for a run of a model of `layers` layers (the run's setting; None: unbound, as registered)."""
        return PyramidKV(layers)

    def budget(self, length: int, ratio: float, layer: int) -> int:
        """n_ℓ, the tokens layer `layer` keeps of `length` at `ratio` (kvpress's get_layer_budget)."""
        if self.layers is None:
            raise ValueError("pyramidkv needs the model's layer count: use the run's press, "
                             "REGISTRY['pyramidkv'].for_run(layers=N)")
        if not 0 <= layer < self.layers:
            raise ValueError(f"pyramidkv was bound to {self.layers} layers, not to layer {layer}")
        return pyramid_kept(length, ratio, self.layers, self.window, PYRAMID_BETA)[layer]

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        keep = self.budget(prefill.length, ratio, prefill.layer)
        return evict(prefill, self.score(prefill, ratio), keep)
