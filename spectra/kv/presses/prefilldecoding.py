"""kvpress 0.5.5's PrefillDecodingPress: the context compressed after the prefill, and the cache kept at that size while
the answer is generated — by one decodable scorer in both phases, or by a scorer after the prefill and a decodable
scorer while decoding.

kvpress's PrefillDecodingPress(prefilling_press, decoding_press) hands the prefill's forward pass to one press and
every later pass to a DecodingPress. `prefill_decoding(<decodable>)` is that class with the same decodable scorer S
in both roles, at spectra's ratio r:

    PrefillDecodingPress(prefilling_press=S(compression_ratio=r),
                         decoding_press=DecodingPress(base_press=S(), compression_interval=I, target_size=n_kept(L, r)))

So after the prefill each layer keeps S's n_kept(L, r) best context rows — as the press S at r would — and then, as
`decoding(S)` (`presses.decoding`) does, every `interval` decoding steps (`spectra cache --compression-interval`,
kvpress's 512 by default) the whole cache is brought back to those n_kept(L, r) rows by S: the cache never holds
more than the target plus `interval` rows, where `decoding(S)` holds the whole context until its first compression.

The rows the prefill keeps stay in the order torch.topk returns them, as kvpress gathers them (spectra's eviction
presses list them in position order, which attention does not see): the decoding compressions read that order —
StreamingLLM's protects the first rows of the cache, whichever tokens they hold, and TOVA's scores row i by the mean
over *all* query heads of their attention to row i and keeps or drops row i in every key/value head together, so
after a prefill press that keeps different tokens per key/value head (SnapKV, Knorm, …) the order decides which
tokens share a score. Two tokens of one head whose prefill scores differ by a rounding can come out in either
order — spectra's SnapKV scores equal kvpress's bitwise at the first layer, past it only to rounding, as the hidden
states do — and a later TOVA compression then drops a different token: a genuine tie, not a different rule
(benchmarks/RESULTS.md §16, prefill_decoding(snapkv,tova)).

`prefill_decoding(<scorer>,<decodable>)` is kvpress's pair of two presses, say SnapKV for the prefill and Knorm while
decoding (`prefill_decoding(snapkv,knorm)`):

    PrefillDecodingPress(prefilling_press=P(compression_ratio=r),
                         decoding_press=DecodingPress(base_press=S(), compression_interval=I, target_size=n_kept(L, r)))

the prefill press P any scorer (kept in torch.topk's order too), the decoding scorer S a decodable one; the
one-argument form is this form with P = S. kvpress takes any press for the prefill; spectra takes a scorer there
(its kept rows are then exactly the decoding target's count, n_kept(L, r)).
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Press, ScorerPress, n_kept, register
from .decoding import DecodingPress

#: where this file's presses come in listings (after the decoding presses)
ORDER = 92


@register
class PrefillDecodingPress(DecodingPress):
    """`prefill_decoding(<decodable>)`: the scorer's eviction at the ratio after the prefill, then `decoding(…)` at
    that size while decoding; `prefill_decoding(<scorer>,<decodable>)`: the first scorer's eviction after the prefill,
    the second's while decoding (see the module docstring)."""

    name, summary = "prefill_decoding", "evicted after the prefill and kept at that size while decoding"
    peer = "PrefillDecodingPress"
    guide = ("kvpress's PrefillDecodingPress with one decodable scorer ({decodables}) in both roles: the scorer "
             "evicts the context at the ratio after the prefill, and decoding(…) keeps the cache at that size while "
             "decoding; or, written prefill_decoding(<scorer>,<decodable>) (e.g. prefill_decoding(snapkv,knorm)), "
             "a scorer ({scorers}; one that does not calibrate) evicts after the prefill and the decodable one keeps "
             "the cache at that size.")
    several, refuses = "scorer,decodable", "calibrates"

    def __init__(self, inner: ScorerPress | None = None, interval: int | None = None,
                 prefilling: ScorerPress | None = None) -> None:
        super().__init__(inner, interval)
        #: the scorer evicting after the prefill, where it is not `inner` (the two-argument form)
        self.prefilling = prefilling
        if prefilling is not None and inner is not None:
            self.name = f"{type(self).name}({prefilling.name},{inner.name})"  # type: ignore[misc]
            for flag in ("needs_rope", "windowed", "calibrates"):
                setattr(self, flag, getattr(prefilling, flag) or getattr(inner, flag))
            self.reads = tuple(dict.fromkeys(prefilling.reads + inner.reads))  # type: ignore[misc]
            self.window = max(prefilling.window, inner.window)
            self.min_context = max(prefilling.min_context, inner.min_context)

    def bind(self, *inner: Press) -> PrefillDecodingPress:  # type: ignore[override]
        """This press around the decodable scorer `inner` (one argument), or evicting with the scorer `inner[0]` after
        the prefill and decoding with the decodable `inner[1]` (two; the registry's `several` checked them)."""
        if len(inner) == 1:
            return super().bind(inner[0])  # type: ignore[return-value]
        prefilling, decoding = inner
        if not isinstance(prefilling, ScorerPress):
            raise TypeError(f"{self.name} evicts after the prefill with a scorer press, not {prefilling.name}")
        bound = super().bind(decoding)
        return type(self)(bound.inner, self.interval, prefilling)  # type: ignore[arg-type]

    def fresh(self) -> PrefillDecodingPress:
        inner = None if self.inner is None else self.inner.fresh()
        prefilling = None if self.prefilling is None else self.prefilling.fresh()
        return type(self)(inner, self.interval, prefilling)  # type: ignore[arg-type]

    def for_run(self, compression_interval: int | None = None, **settings: object) -> PrefillDecodingPress:
        return type(self)(self.inner, compression_interval, self.prefilling)

    @property
    def evicting(self) -> ScorerPress:
        """The scorer evicting after the prefill: the first of two, or the one scorer."""
        return self.prefilling if self.prefilling is not None else self.wrapped

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        """The evicting scorer's n_kept(L, ratio) best context rows per key/value head, in torch.topk's order."""
        keep = n_kept(prefill.length, ratio)
        kept = torch.topk(self.evicting.score(prefill, ratio), keep, dim=-1).indices
        return Compressed(kept, 1.0 - keep / prefill.length)
