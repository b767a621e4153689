"""`composed(<press>,<press>,…)`: presses applied in turn to one layer's cache, each compressing what the one before
kept — kvpress 0.5.5's `ComposedPress` (e.g. a token eviction followed by a channel pruning: `composed(snapkv,think)`,
the combination of sequence and dimension compression its docstring proposes).

kvpress runs each press's forward hook in order after the prefill of a layer: the second press finds in the cache
the keys and values the first one kept, and computes its scores on them, while what it reads of the forward pass (the
hidden states, so the queries it forms) is the whole context's. Here each press after the first is handed a `Prefill`
of the rows the one before kept (`narrowed`): their keys, values and keys before RoPE, in the order kvpress's cache
holds them (a scorer's rows in torch.topk's order, as kvpress gathers them — StreamingLLM's sinks are then the first
rows of that order, SnapKV's window its last ones), the same queries (the window's post-RoPE queries; the context's
queries before RoPE), and its window attention computed again over the kept keys (kvpress's SnapKV recomputes it from
the cache it finds). Every press compresses at the cell's ratio (kvpress's presses each take their own
`compression_ratio`; spectra's one ratio is given to each): a chain of k token presses keeps about (1 − r)ᵏ of the
context, n_kept of n_kept of … (each max(1, int(rows · (1 − r)))). The memory saved is kvpress's account,
1 − Π (1 − saved_i). The bytes stored are the rows the chain keeps, as the last press storing its rows otherwise
than at full width (`Compressed.stored`: think's pruned key channels, kivi's codes) stores them, wherever it stands:
composed(think,snapkv) stores SnapKV's rows at ThinK's width and channel mask, as composed(snapkv,think) does.

kvpress refuses AdaKVPress and KVzipPress inside a ComposedPress, and warns that a press reading the forward pass's
attention weights (ObservedAttention) fails after another; here the arguments are presses named alone (no wrapper)
that do not compress while decoding, read no received attention, run no whole-model pass (`kv.passes`) and fit no
calibration (`refuses`). A press whose heads keep different numbers of tokens, or whose rows are no context tokens (linformer),
can only come last. Its `axis` is its presses' axes in turn, each once: `tokens` for token presses alone,
`tokens+channels` for composed(snapkv,think) — a chain across axes is no single axis, so the axis map of
`--bytes-kept` (`kv.axes`) leaves it out. kvpress's
pipeline decodes the question after a ComposedPress at the original context length, even where a press inside it
re-rotated its keys, and so does this press (no `Compressed.start`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..passes import PASSES
from .base import Compressed, Prefill, Press, ScorerPress, n_kept, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 95

#: the flags a composed press takes from the presses it applies (any of them setting it), and the numbers (the largest)
FLAGS, NUMBERS = ("needs_rope", "windowed"), ("window", "min_context")


def gathered(cached: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The rows `rows` (H_kv, m) of `cached` (H_kv, L, d)."""
    return cached.gather(1, rows[..., None].expand(-1, -1, cached.shape[-1]))


def narrowed(prefill: Prefill, rows: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> Prefill:
    """`prefill` as the next press of a chain finds it: the cache holds the rows `rows` (H_kv, m) of `prefill`'s
    rows, with keys `key` and values `value` (H_kv, m, d); the queries are the same, the window attention is formed
    again over the kept keys (`Prefill.window`), the keys before RoPE are gathered, and the passes a chain hands on
    (`kv.passes.Pass.chained`: the whole context's pre-RoPE queries) are the same."""
    key_pre = None if prefill.key_pre is None else gathered(prefill.key_pre, rows)
    chained = {name: found for name, found in prefill.passes.items() if PASSES[name].chained}
    return Prefill(prefill.layer, prefill.q, key, value, key_pre, None, prefill.scaling, prefill.seed, prefill.index,
                   w_o=prefill.w_o, rope=prefill.rope, passes=chained)


def stage(press: Press, prefill: Prefill, ratio: float) -> Compressed:
    """One press of the chain on `prefill`: a scorer's n_kept best rows in torch.topk's order (kvpress's gather
    order, which the next press may read), any other press's own `compress`."""
    if isinstance(press, ScorerPress):
        keep = n_kept(prefill.length, ratio)
        kept = torch.topk(press.score(prefill, ratio), keep, dim=-1).indices
        return Compressed(kept, 1.0 - keep / prefill.length)
    return press.compress(prefill, ratio)


@register
class Composed(Press):
    """`composed(a,b,…)`: the presses a, b, … applied in turn at the cell's ratio, each to the rows the one before
    kept (see the module docstring). The registry's unbound `composed` compresses nothing."""

    name, summary = "composed", "presses applied in turn, each to the rows the one before kept"
    peer = "ComposedPress"
    several, refuses = "press,press…", "decodes,received,whole_model,calibrates"
    ratio_means = "each press's own ratio, applied in turn (k token presses keep about (1 − r)ᵏ of the tokens)"
    guide = ("kvpress's `ComposedPress` over two or more presses named alone, none of which compresses while "
             "decoding, reads the received attention, runs a whole-model pass (kvzip, kvcompose, kvgrad) or "
             "calibrates: the first press "
             "compresses the context's cache, the next one compresses the rows it kept (scoring them as the cache it "
             "finds, with the whole context's queries), and so on — e.g. `composed(snapkv,think)`, tokens then "
             "key channels. "
             "Each press compresses at the ratio, so two token presses at 0.5 keep about a quarter of the tokens; "
             "the memory saved is 1 − Π(1 − saved), and the bytes are the rows the chain keeps stored as its last "
             "press storing them narrower (think's key channels, kivi's codes) stores them, wherever it stands. A press "
             "whose rows are no context tokens (linformer) can only come last.")

    def __init__(self, *inner: Press) -> None:
        self.inner = tuple(inner)
        if inner:
            self.name = f"{type(self).name}({','.join(press.name for press in inner)})"  # type: ignore[misc]
            for flag in FLAGS:
                setattr(self, flag, any(getattr(press, flag) for press in inner))
            self.reads = tuple(dict.fromkeys(name for press in inner for name in press.reads))  # type: ignore[misc]
            for number in NUMBERS:
                setattr(self, number, max(getattr(press, number) for press in inner))
            # what the chain removes: its presses' axes in turn, once each ("tokens+channels" for snapkv then think)
            self.axis = "+".join(dict.fromkeys(press.axis for press in inner))  # type: ignore[misc]

    def bind(self, *inner: Press) -> Composed:
        """These presses composed (the registry checked that they are two or more presses it may compose)."""
        if len(inner) < 2:
            raise TypeError(f"{type(self).name} composes two or more presses, got {len(inner)}")
        return type(self)(*inner)

    def fresh(self) -> Composed:
        return type(self)(*(press.fresh() for press in self.inner))

    def for_run(self, **settings: object) -> Composed:
        """Each press as the run uses it (pyramidkv reads the model's `layers`)."""
        return type(self)(*(press.for_run(**settings) for press in self.inner))

    def statistics(self) -> dict[str, np.ndarray]:
        return {}

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        """The presses in turn at `ratio`; the rows the last one kept, as positions of the context."""
        if not self.inner:
            raise ValueError(f"{type(self).name} needs presses: name them as {type(self).name}(<press>,<press>,…)")
        current = prefill
        positions = torch.arange(prefill.length, device=prefill.key.device).expand(prefill.kv_heads, -1)
        retained, explicit, part, storing = 1.0, False, None, None
        for number, press in enumerate(self.inner):
            part = stage(press, current, ratio)
            retained *= 1.0 - part.saved
            last = number == len(self.inner) - 1
            if part.stored is not None and not last:
                storing = press
            if part.valid is not None and not last:
                raise ValueError(f"{press.name} keeps different numbers of tokens per head: in {self.name} it can "
                                 "only come last")
            if part.kept is None:
                if not last:
                    raise ValueError(f"{press.name}'s rows are no context tokens: in {self.name} it can only come "
                                     "last")
                return Compressed(None, 1.0 - retained, key=part.key, value=part.value, stored=part.stored)
            explicit = explicit or part.key is not None or part.value is not None
            key, value = part.rows(current.key, current.value)
            positions = positions.gather(1, part.kept)
            if not last:
                current = narrowed(current, part.kept, key, value)
        assert part is not None
        stored = part.stored
        if stored is None and storing is not None:  # the rows kept, stored as the press that narrowed them stores
            key, value = (key, value) if explicit else (gathered(prefill.key, positions),
                                                        gathered(prefill.value, positions))
            stored = storing.compress(narrowed(prefill, positions, key, value), ratio).stored
        if not explicit:
            return Compressed(positions, 1.0 - retained, valid=part.valid, stored=stored)
        return Compressed(positions, 1.0 - retained, key=key, value=value, valid=part.valid, stored=stored)

