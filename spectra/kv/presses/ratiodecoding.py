"""kvpress 0.5.5's CompressionRatioDecodingPress: while the answer is generated, the cache kept at a *share* of the
tokens seen so far, by a scorer press.

`compression_ratio_decoding(<decodable>)` is `decoding(<decodable>)` (`presses.decoding`: nothing compressed after
the prefill, then every `interval` decoding steps — kvpress's `compression_interval`, 512 by default, `spectra cache
--compression-interval` — each layer's whole cache brought back to a size by the scorer, right after that step's
attention in that layer) with one difference: the size is not fixed but recomputed at every compression from the
tokens seen so far, S = the step's last logical position + 1 (kvpress reads it from `position_ids`, which its
pipeline sets to the original positions whatever the cache holds):

    size = max(1, int(S · (1 − ratio)))      (kvpress's target_compression_ratio is spectra's ratio)

So the cache follows the text: after the prefill of L context tokens it holds L rows; a compression after S tokens
leaves n_kept(S, ratio) of them, whichever the scorer ranks first among the rows still cached (the context, the
question and the tokens decoded so far). The due test is DecodingPress's with that size: `interval` steps since the
last compression, or a pass of at least `size` tokens. (kvpress's default ratio is 0.5; spectra's `--ratios` sets
it, and must be below 1, as kvpress asserts.)

Its kept share and bytes in the tables are those at the context, n_kept(L, ratio) (as decoding(…)'s, the eviction
press at that ratio): the size right after a compression grows with the text from there.

Why a share: a fixed target (DecodingPress) compresses a long generation ever harder; a share keeps the eviction
ratio the same from the first token to the last, the regime the prefill presses are evaluated in.
"""

from __future__ import annotations

from .base import n_kept, register
from .decoding import DecodingPress

#: where this file's presses come in listings (right after decoding(…))
ORDER = 91


@register
class CompressionRatioDecodingPress(DecodingPress):
    """`compression_ratio_decoding(<decodable>)`: `decoding(<decodable>)` whose size at a compression is the ratio's
    share of the tokens seen so far (see the module docstring)."""

    name, summary = "compression_ratio_decoding", "kept at the ratio's share of the tokens seen while decoding"
    peer = "CompressionRatioDecodingPress"
    guide = ("kvpress's CompressionRatioDecodingPress over a decodable scorer ({decodables}): decoding(…) whose size "
             "at each compression is the ratio's share of the tokens seen so far, max(1, int(S · (1 − ratio))).")

    def size(self, target: int, seen: int, ratio: float) -> int:
        """max(1, int(seen · (1 − ratio))): kvpress's target, recomputed from the tokens seen so far (`target`, the
        size at the context, is not read)."""
        if seen < 1:
            raise ValueError(f"{self.name} sizes its cache from the tokens seen so far, and none were given: set "
                             "Recompression.seen (the pass's last logical position + 1) before the pass")
        if not 0 <= ratio < 1:
            raise ValueError(f"{self.name}'s ratio is a share of the tokens seen removed, in [0, 1), not {ratio}")
        return n_kept(seen, ratio)
