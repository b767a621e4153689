"""The eviction presses of kvpress 0.5.5 at their defaults: each scores the L context tokens per key/value head
and keeps the top n_kept (`base.ScorerPress`). Formulas as kvpress computes them (notes in each docstring).

- `streaming` (StreamingLLM): the first 4 tokens (attention sinks) and the most recent ones;
- `knorm`: the smallest key norms, score −‖k‖;
- `snapkv`: attention of the last 64 context queries (its `window`, kvpress's window_size, declared once in its
  class: `base.WINDOW` reads it), averaged over them, pooled along the keys, averaged over each key/value group; the
  window's tokens always kept;
- `tova`: attention of the last context query averaged over all heads of the layer; the last token always kept;
- `random`: uniform scores from a torch generator seeded by (run seed, sequence index), the same at every layer;
- `observed`: the attention each key received during the prefill, divided by the queries that could see it.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from ...seeds import Domain, derive_seed
from .base import Prefill, ScorerPress, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 10

#: StreamingLLM's attention sinks and SnapKV's pooling kernel (kvpress's defaults)
SINKS, KERNEL = 4, 5


def protect_last(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Scores of the first L − count tokens followed by `count` tokens scored max + 1 over the whole tensor (all heads),
    so they are always kept — kvpress's way of protecting a window."""
    return functional.pad(scores, (0, count), value=scores.max().item() + 1)


@register
class Streaming(ScorerPress):
    """StreamingLLM: keeps the first SINKS tokens and the most recent ones. kvpress counts the pruned tokens as
    L − int(L(1 − r)) (no floor at 1) and zero-scores them right after the sinks; ties are broken by topk."""

    name, summary = "streaming", "the first 4 tokens and the most recent"
    peer = "StreamingLLMPress"
    decodable = True  # its score reads only positions: decoding(streaming) applies it at a decoding step
    rowscorer = True  # and chunk(streaming), block(streaming) score each subset of rows by its positions in the subset

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        length = prefill.length
        pruned = length - int(length * (1 - ratio))
        scores = torch.ones(prefill.kv_heads, length, dtype=prefill.key.dtype, device=prefill.key.device)
        scores[:, SINKS:SINKS + pruned] = 0
        return scores


@register
class Knorm(ScorerPress):
    """Knorm: score −‖k‖₂ of the post-RoPE cached key, computed in float32 or wider as kvpress does."""

    name, summary = "knorm", "the smallest key norms"
    peer = "KnormPress"
    decodable = True  # its score reads only the cached keys: decoding(knorm) applies it at a decoding step
    rowscorer = True

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        wide = torch.promote_types(prefill.key.dtype, torch.float32)
        return -torch.linalg.vector_norm(prefill.key, dim=-1, dtype=wide)


@register
class SnapKV(ScorerPress):
    """SnapKV: m_j = mean over the last w = WINDOW context queries of their attention to key j (the softmax over all
    L keys, not renormalised over the first L − w), average-pooled along j (kernel KERNEL, zero padding counted),
    averaged over each key/value group; the w window tokens are always kept. Needs L > w."""

    window = 64  # kvpress's window_size
    name, summary = "snapkv", "the keys the last 64 queries attend to"  # its window, as a literal for --help
    peer = "SnapKVPress"
    windowed = True

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        window = prefill.window.shape[1]
        length = prefill.length
        if length <= window:
            raise ValueError(f"snapkv needs more than {window} context tokens, got {length}")
        attention = prefill.window[:, :, : length - window].mean(dim=1)  # (H, L − w)
        pooled = functional.avg_pool1d(attention[None], kernel_size=KERNEL, padding=KERNEL // 2, stride=1)[0]
        return protect_last(prefill.group_mean(pooled), window)


@register
class TOVA(ScorerPress):
    """TOVA as kvpress implements it: the last context query's attention to each earlier key, averaged over all
    query heads of the layer (so every key/value head keeps the same tokens); the last token always kept."""

    name, summary = "tova", "the keys the last query attends to"
    peer = "TOVAPress"
    decodable = True  # its score reads only the last query: decoding(tova) applies it at a decoding step

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        last = prefill.window[:, -1, :-1].mean(dim=0)  # (L − 1,)
        return protect_last(last[None], 1).expand(prefill.kv_heads, -1)


@register
class Random(ScorerPress):
    """Uniform scores: torch.rand(1, H_kv, L) from a CPU/device generator seeded by (run seed, sequence index) anew at
    every layer (kvpress's RandomPress(seed) reseeds at every layer, so all layers keep the same positions)."""

    name, summary = "random", "uniformly random tokens"
    peer = "RandomPress"
    rowscorer = True  # a subset of m rows draws torch.rand(1, H_kv, m) from the same seed, as kvpress's does

    @staticmethod
    def seed_of(seed: int, index: int) -> int:
        """The generator's seed for sequence `index` of a run seeded `seed` (what kvpress's RandomPress is given)."""
        return derive_seed(seed, Domain.RANDOM_PRESS, index)

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        key = prefill.key
        generator = torch.Generator(device=key.device).manual_seed(self.seed_of(prefill.seed, prefill.index))
        return torch.rand(1, prefill.kv_heads, prefill.length, generator=generator, dtype=key.dtype,
                          device=key.device)[0]


@register
class Observed(ScorerPress):
    """ObservedAttention: key j's attention summed over all L context queries, divided by the L − j queries that can
    see it, averaged over each key/value group (not H2O's plain sum)."""

    name, summary = "observed", "the keys the prefill attended to most"
    peer = "ObservedAttentionPress"
    reads = ("received",)

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        received = prefill.read("received")
        seen_by = torch.arange(prefill.length, 0, -1, device=received.device, dtype=received.dtype)
        return prefill.group_mean(received / seen_by)
