"""kvpress 0.5.5's PrefillDecodingPress, with one scorer in both phases: the context compressed after the prefill, and
the cache kept at that size while the answer is generated.

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
StreamingLLM's protects the first rows of the cache, whichever tokens they hold.

Why only one scorer: the registry's `name(argument)` takes one declared name; kvpress's pair of two presses (say
SnapKV for the prefill and Knorm while decoding) needs a two-argument form (`--presses` splits on commas, and
`wraps` names one fact) — not added here.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, n_kept, register
from .decoding import DecodingPress

#: where this file's presses come in listings (after the decoding presses)
ORDER = 92


@register
class PrefillDecodingPress(DecodingPress):
    """`prefill_decoding(<decodable>)`: the scorer's eviction at the ratio after the prefill, then `decoding(…)` at
    that size while decoding (see the module docstring)."""

    name, summary = "prefill_decoding", "evicted after the prefill and kept at that size while decoding"
    peer = "PrefillDecodingPress"
    guide = ("kvpress's PrefillDecodingPress with one decodable scorer ({decodables}) in both roles: the scorer "
             "evicts the context at the ratio after the prefill, and decoding(…) keeps the cache at that size while "
             "decoding.")

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        """The scorer's n_kept(L, ratio) best context rows per key/value head, in torch.topk's order."""
        keep = n_kept(prefill.length, ratio)
        kept = torch.topk(self.wrapped.score(prefill, ratio), keep, dim=-1).indices
        return Compressed(kept, 1.0 - keep / prefill.length)
