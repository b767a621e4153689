"""`kvzip` (KVzip, Kim et al. 2025, arXiv:2505.23416): keep the cached pairs the model needs to reconstruct its
context — query-agnostic compression, scored once per example and shared by every ratio.

The score is not read off the prefill: after it, the model is asked to repeat the context (a prompt, then the context
itself, attending to the prefilled cache), and each cached pair is scored by the largest attention any repeated token
of its key/value head's group gives it — the engine's reconstruction pass (`spectra.kv.reconstruction`, which this
press asks for by declaring `reads = ("reconstruction",)`), whose scores of every layer reach each layer's `Prefill.reconstruction`.
The attention sinks (the first 4 positions) score above everything.

kvpress 0.5.5's KVzipPress is the peer, at its defaults (n_sink 4, chunk_size 2048, KVzip+ normalisation off,
`layerwise` off). Its ratio is shared by all layers, not applied to each: the int(N · r) lowest scores of all N =
layers · H_kv · L cached pairs are evicted (torch.topk over the flattened scores), so each layer loses as many as
it holds among them, and within a layer those are evicted again by torch.topk over its heads' flattened scores —
heads and layers keep different numbers of tokens, no head fewer than the sinks (kvpress uses no safeguard).
`layerwise=True` evicts int(H_kv · L · r) per layer instead. kvpress keeps the evicted pairs in its cache and hides
them from attention with a fake key; here they are dropped (`presses.per_head`), the same attention up to float
rounding. kvpress does not use `n_kept`: its kept count is what the global ranking leaves. On a model with
sliding-window layers (Gemma 3, whose every model kvpress's KVzipPress refuses) the local layers keep their windows
(`--local-layers keep`) and the global layers' pairs alone are ranked: the ratio is the share of their cache evicted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Compressed, Prefill, Press, per_head, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 45


def pruned_counts(scores: torch.Tensor, ratio: float, layerwise: bool = False) -> torch.Tensor:
    """(layers,) the pairs each layer loses when `ratio` of the cache is evicted by the reconstruction `scores`
    (layers, H_kv, L): the int(N · r) lowest of all N pairs, counted per layer (kvpress's bincount), or int(H_kv ·
    L · r) in every layer (`layerwise`)."""
    layers, heads, length = scores.shape
    if layerwise:
        return torch.full((layers,), int(heads * length * ratio), dtype=torch.long)
    lowest = torch.topk(-scores.reshape(-1), int(scores.numel() * ratio)).indices
    return torch.bincount(lowest // (heads * length), minlength=layers).cpu()


def kvzip_keep(scores: torch.Tensor, pruned: int) -> torch.Tensor:
    """(H_kv, L) bool: a layer's `scores` (H_kv, L) less its `pruned` lowest over all its heads (torch.topk)."""
    keep = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    keep[torch.topk(-scores.reshape(-1), pruned).indices] = False
    return keep.view(scores.shape)


@register
class KVzip(Press):
    """KVzip: the pairs the model attends to most while it repeats the context, ranked across layers (see the module
    docstring); `layerwise` evicts the same share of every layer."""

    name, summary = "kvzip", "the pairs the model attends to most while it repeats the context"
    peer = "KVzipPress"
    #: the scores it ranks across layers: one whole-model pass's (`kv.passes`), KVzip's reconstruction; its budget
    #: is the (global) layers' pairs together
    reads, across_layers = ("reconstruction",), True

    def __init__(self, layerwise: bool = False, local: tuple[bool, ...] | None = None) -> None:
        self.layerwise, self.local = layerwise, local
        #: the last (scores, ratio) ranked and its per-layer counts: every layer of an example reads the same scores
        self._ranked: tuple[torch.Tensor, float, torch.Tensor] | None = None

    def fresh(self) -> Press:
        return type(self)(self.layerwise, self.local)

    def for_run(self, windows: Sequence[int | None] | None = None, **settings: object) -> Press:
        """This press for a run of a model whose layers have these sliding `windows` (None: every layer global): a
        local layer keeps its window whatever the press (`kv.locallayers`), so the global layers' pairs alone are
        ranked, int(N_global · r) of them evicted."""
        if not windows or not any(window is not None for window in windows):
            return self
        return type(self)(self.layerwise, tuple(window is not None for window in windows))

    def counts(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        """(layers,) the pairs each layer loses (`pruned_counts`), over the global layers only where `local` marks
        the model's sliding-window layers (0 for those)."""
        if self.local is None:
            return pruned_counts(scores, ratio, self.layerwise)
        found = torch.zeros(scores.shape[0], dtype=torch.long)
        chosen = ~torch.tensor(self.local)
        found[chosen] = pruned_counts(scores[chosen.to(scores.device)], ratio, self.layerwise)
        return found

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        scores = prefill.read(self.reads[0])  # every layer's scores of the example (layers, H_kv, L)
        if self._ranked is None or self._ranked[0] is not scores or self._ranked[1] != ratio:
            self._ranked = (scores, ratio, self.counts(scores, ratio))
        pruned = int(self._ranked[2][prefill.layer])
        return per_head(prefill, kvzip_keep(scores[prefill.layer], pruned))
