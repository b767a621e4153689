"""`kvcompose` (KVCompose, arXiv:2509.05165): keep the pairs the context, read a second time, attends to most, with a
budget shared across layers so that layers whose scores stay high keep more — and every key/value head of a layer
the same count, so the cache stays one rectangular tensor per layer (the paper's "structured" composite tokens).

The scores are the replay pass's (`spectra.kv.composition`, which this press asks for by declaring `reads = ("composition",)`):
per layer ℓ and key/value head h, s_ℓh(j) = the mean over h's query heads of the largest weight any replayed context
token gives cached token j. Each is raised by its layer's mean over the heads, s_ℓh ← s_ℓh + mean_h' s_ℓh'. A
layer's composite curve is the mean over its heads of their scores sorted in descending order, c_ℓ(i); layer 0's is
replaced by the largest curve of all layers, max_ℓ c_ℓ(i). The n_kept = max(1, int(N · (1 − r))) largest of the N =
layers · L composite values (torch.topk over them flattened) fix each layer's count m_ℓ (how many of them it holds,
at least 1), and each head of layer ℓ keeps its m_ℓ best tokens by its own score (torch.argsort, descending). So the
ratio is the share of the whole cache's tokens removed, layers keeping different counts.

kvpress 0.5.5's `KVComposePress` is the peer, at its defaults (structured, agg_task max, agg_group mean, agg_head
mean, add_v_norm off, add_mean_across_heads on, keep_token_lower_bound 0), computed as it computes them: float32
scores, the group and head means summed in order and divided.

On a model with sliding-window layers (Gemma 3) each local layer keeps its window whatever the press
(`--local-layers keep`, `kv.locallayers`), so the budget is shared among the global layers alone: N = global layers
· L composite values, the ratio the share of the global layers' cache removed. Layer 0's curve is raised to the
largest only where layer 0 is global: the rule keeps the model's first layer from being starved, and a local first
layer keeps its window anyway (the first global layer is no first layer to the model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Compressed, Prefill, Press, n_kept, per_head, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 46


def enhanced(scores: torch.Tensor) -> torch.Tensor:
    """(layers, H_kv, L): each layer's replay `scores` raised by their mean over the layer's key/value heads."""
    return torch.stack([layer + layer.mean(dim=0, keepdim=True) for layer in scores])


def layer_counts(scores: torch.Tensor, ratio: float, local: Sequence[bool] | None = None) -> torch.Tensor:
    """(layers,) the tokens each layer's heads keep, given the `enhanced` scores (layers, H_kv, L): the layers'
    shares of the n_kept best composite values (the module docstring), at least 1 — among the global layers alone
    where `local` marks the sliding-window ones (whose count is then their whole L: they are not compressed)."""
    layers, heads, length = scores.shape
    chosen = torch.arange(layers) if local is None else torch.tensor(
        [layer for layer, windowed in enumerate(local) if not windowed], dtype=torch.long)
    ranked = scores[chosen.to(scores.device)].sort(dim=-1, descending=True).values
    composite = ranked[:, 0].clone()
    for head in range(1, heads):
        composite += ranked[:, head]
    composite /= heads
    if chosen[0] == 0:  # the model's first layer: raised to the largest curve
        composite[0] = composite.max(dim=0).values
    kept = composite.reshape(-1).topk(n_kept(composite.numel(), ratio)).indices // length
    found = torch.full((layers,), length, dtype=torch.long)
    found[chosen] = torch.bincount(kept, minlength=len(chosen)).clamp(min=1).cpu()
    return found


def head_keep(scores: torch.Tensor, count: int) -> torch.Tensor:
    """(H_kv, L) bool: each head's `count` best tokens by its `scores` (H_kv, L) (torch.argsort, descending)."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for head, row in enumerate(scores):  # one argsort per head, as kvpress sorts them (equal scores alike)
        keep[head, torch.argsort(row, descending=True)[:count]] = True
    return keep


@register
class KVCompose(Press):
    """KVCompose: the replay pass's scores, the budget shared across layers, every head of a layer keeping the same
    count (see the module docstring)."""

    name, summary = "kvcompose", "the pairs a second reading attends to, budgets shared across layers"
    peer = "KVComposePress"
    reads = ("composition",)
    across_layers = True  # its budget: every layer's tokens together

    def __init__(self, local: tuple[bool, ...] | None = None) -> None:
        #: which layers slide a window (`for_run`): the budget is the global layers'
        self.local = local
        #: the last (scores, ratio) allocated, its enhanced scores and counts: every layer of an example reads them
        self._allocated: tuple[torch.Tensor, float, torch.Tensor, torch.Tensor] | None = None

    def fresh(self) -> Press:
        return type(self)(self.local)

    def for_run(self, windows: Sequence[int | None] | None = None, **settings: object) -> Press:
        """This press for a run of a model whose layers have these sliding `windows` (None: every layer global): a
        local layer keeps its window whatever the press (`kv.locallayers`), so the global layers share the budget."""
        if not windows or not any(window is not None for window in windows):
            return self
        return type(self)(tuple(window is not None for window in windows))

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        scores = prefill.read("composition")
        if self._allocated is None or self._allocated[0] is not scores or self._allocated[1] != ratio:
            raised = enhanced(scores)
            self._allocated = (scores, ratio, raised, layer_counts(raised, ratio, self.local))
        _, _, raised, counts = self._allocated
        return per_head(prefill, head_keep(raised[prefill.layer], int(counts[prefill.layer])))
