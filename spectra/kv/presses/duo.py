"""DuoAttention (Xiao et al. 2024, arXiv:2410.10819) as kvpress 0.5.5's `DuoAttentionPress`, given a head pattern:
retrieval heads keep the whole cache, streaming heads only the first `sink_size` and the last `recent_size` tokens.

`duo(DIR)` reads the pattern in DIR (`spectra.kv.headpattern`: full_attention_heads.tsv, layers × key/value heads in
[0, 1], and config.json's `sink_size` and `recent_size` — what `spectra heads` writes into its run directory, and what
DuoAttention's and kvpress's loaders read). The ratio is kvpress's `head_compression_ratio`: the share of key/value
heads made streaming, the round(r · N) lowest scores of the N = layers × H_kv (`np.argsort` of the flattened matrix,
kvpress's call and tie-break). A streaming head evicts positions sink_size … L − recent_size − 1 (Python's slice
[sink_size : −recent_size], so nothing at recent_size 0, as in kvpress). The memory saved is therefore not the
ratio: kvpress's `compression_ratio` is r · (1 − (sink_size + recent_size)/L); the tables report what each head kept.
"""

from __future__ import annotations

import numpy as np
import torch

from ..headpattern import HeadPattern, read
from .base import Compressed, Prefill, Press, full, per_head, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 75


def streaming_heads(scores: np.ndarray, ratio: float) -> np.ndarray:
    """(layers, H_kv) bool: the round(ratio · N) key/value heads with the lowest scores, as kvpress chooses them."""
    streaming = np.zeros(scores.size, dtype=bool)
    count = round(scores.size * ratio)
    if count > 0:
        streaming[np.argsort(scores, axis=None)[:count]] = True
    return streaming.reshape(scores.shape)


def streaming_window(length: int, sink_size: int, recent_size: int) -> torch.Tensor:
    """(L,) bool: the positions a streaming head keeps (all but the slice [sink_size : −recent_size])."""
    keep = torch.ones(length, dtype=torch.bool)
    keep[torch.arange(length)[sink_size:-recent_size] if recent_size else torch.arange(0)] = False
    return keep


@register
class Duo(Press):
    """`duo(DIR)`: DuoAttention's retrieval and streaming heads from the pattern in DIR (see the module docstring)."""

    name, summary = "duo", "the whole cache for retrieval heads, sink + recent tokens for streaming heads"
    peer = "DuoAttentionPress"
    guide = ("DuoAttention (kvpress's `DuoAttentionPress`) given a head pattern: a retrieval head keeps the whole "
             "cache, a streaming head only the first `sink_size` and the last `recent_size` tokens. The pattern is a "
             "directory with `full_attention_heads.tsv` (layers × key/value heads, a score in [0, 1] each) and "
             "`config.json` (`sink_size`, `recent_size`): what DuoAttention publishes for its models and what "
             "`spectra heads` writes into its run directory (its `--sinks` and `--recent` become the sink and the "
             "recent window; the matrix holds 1 for the `--duo-share` of key/value heads with the highest retrieval "
             "score and 0 for the others, [formats.md](formats.md) has the format). The ratio is kvpress's "
             "`head_compression_ratio`: the share of key/value heads made streaming, the round(r · N) lowest scores "
             "of the N = layers × H_kv (equal scores in kvpress's `argsort` order, so with a `spectra heads` pattern a "
             "ratio up to 1 − duo-share streams heads it marked 0), not a share of tokens: the memory saved is "
             "r · (1 − (sink + recent) / L), less than r, and the tables report what each head kept.")
    argument, check = "pattern", "spectra.kv.headpattern:check"
    ratio_means = "the share of key/value heads made streaming"

    def __init__(self, pattern: HeadPattern | None = None, where: str = "") -> None:
        self.pattern, self.where = pattern, where
        if pattern is not None:
            self.name = f"duo({where})"  # type: ignore[misc]

    def bind(self, argument: str) -> Duo:
        """The press reading the pattern in the directory `argument`."""
        return Duo(read(argument), argument)

    def fresh(self) -> Press:
        return self

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        pattern = self.pattern
        if pattern is None:
            raise ValueError("duo needs a head pattern: name it as duo(<directory>)")
        if pattern.layers <= prefill.layer or pattern.kv_heads != prefill.kv_heads:
            raise ValueError(f"the pattern in {self.where} is {pattern.layers} × {pattern.kv_heads}; layer "
                             f"{prefill.layer} has {prefill.kv_heads} key/value heads")
        streaming = torch.from_numpy(streaming_heads(pattern.scores, ratio)[prefill.layer]).to(prefill.key.device)
        if not streaming.any():
            return full(prefill)
        window = streaming_window(prefill.length, pattern.sink_size, pattern.recent_size).to(prefill.key.device)
        return per_head(prefill, ~streaming[:, None] | window[None])
