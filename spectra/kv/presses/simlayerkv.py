"""`simlayerkv` (SimLayerKV, Zhang et al. 2024, arXiv:2410.13846): whole layers found "lazy" keep only their first
and most recent tokens (StreamingLLM's cache), the other layers every token.

The paper observes that in some layers the last tokens attend almost only to the attention sinks and to their own
neighbourhood, whatever the prompt: those layers lose little by forgetting the middle of the context, while the
others need all of it. It decides per layer and per prompt, from the attention the prefill computed anyway.

kvpress 0.5.5's SimLayerKVPress is the peer, at its defaults (lazy_threshold 1.0, n_last 1, n_recent 1024,
n_initial 4), read to the letter. In each layer of a context of L tokens:

- the attention of the last n_last context queries over the L keys (causal, softmax over all L, as the prefill's
  window rows are), with the n_last last keys dropped, averaged over the queries and over every query head: a
  weight a_j for each of the first L − n_last keys;
- the layer is lazy when a_0 + … + a_{n_initial−1} plus the sum of the last n_recent of those a_j (positions
  L − n_last − n_recent … L − n_last − 1) exceeds lazy_threshold;
- a lazy layer keeps the first n_initial tokens and the last n_recent − n_last (kvpress's `keys[-n_recent +
  n_last:]`, Python's slicing), every key/value head the same; any other layer keeps every token. Nothing is
  compressed when lazy_threshold is 1.0 or L ≤ n_initial + n_recent + n_last.

So at kvpress's defaults the press never compresses: a threshold of 1.0 is what kvpress ships (its docstring
recommends 0.9 for Llama 3, 0.65 for Llama 2, 0.8 for Mistral, 0.85 for Qwen), and n_recent 1024 keeps any context
up to 1029 tokens whole. Its ratio cannot be set (kvpress raises on it): spectra's ratio is ignored, and what it
saved is what the table's kept share says. The lazy test reads the last query's attention row of the prefill
(`Prefill.window`), which every prefill carries: it is not a `windowed` press, and reads nothing else.
"""

from __future__ import annotations

import torch

from .base import WINDOW, Compressed, Prefill, Press, full, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 76


@register
class SimLayerKV(Press):
    """SimLayerKV: a lazy layer keeps its first `n_initial` and last `n_recent − n_last` tokens, the others all
    (see the module docstring); the defaults are kvpress's."""

    name, summary = "simlayerkv", "lazy layers streamed (their first and recent tokens), the others whole"
    peer = "SimLayerKVPress"
    ratio_means = "ignored (lazy layers keep their first 4 and last 1023 tokens; at kvpress's threshold 1.0, none is)"

    def __init__(self, lazy_threshold: float = 1.0, n_last: int = 1, n_recent: int = 1024,
                 n_initial: int = 4) -> None:
        if not 0.0 <= lazy_threshold <= 1.0:
            raise ValueError(f"simlayerkv's lazy_threshold must lie in [0, 1], got {lazy_threshold}")
        if not 1 <= n_last <= WINDOW:
            raise ValueError(f"simlayerkv reads the last 1 to {WINDOW} context queries (n_last), got {n_last}")
        if n_recent <= n_last or n_initial < 0:  # kvpress's keys[-n_recent + n_last:] would keep every key again
            raise ValueError(f"simlayerkv needs n_recent > n_last and n_initial ≥ 0, got n_recent {n_recent}, n_last "
                             f"{n_last}, n_initial {n_initial}")
        self.lazy_threshold, self.n_last, self.n_recent, self.n_initial = lazy_threshold, n_last, n_recent, n_initial

    def fresh(self) -> SimLayerKV:
        return SimLayerKV(self.lazy_threshold, self.n_last, self.n_recent, self.n_initial)

    def laziness(self, prefill: Prefill) -> float:
        """The attention of the last n_last queries, averaged over them and every query head, on the first n_initial
        and the last n_recent of the keys before them (kvpress's `is_lazy` score)."""
        length = prefill.length
        rows = prefill.window[:, -self.n_last:, : length - self.n_last]  # (H, n_last, L − n_last)
        weights = rows.mean(dim=(0, 1))
        return float(weights[: self.n_initial].sum() + weights[-self.n_recent:].sum())

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        length = prefill.length
        if self.lazy_threshold == 1.0 or length <= self.n_initial + self.n_recent + self.n_last:
            return full(prefill)
        if not self.laziness(prefill) > self.lazy_threshold:
            return full(prefill)
        positions = torch.arange(length, device=prefill.key.device)
        kept = torch.cat([positions[: self.n_initial], positions[-self.n_recent + self.n_last:]])
        return Compressed(kept.expand(prefill.kv_heads, -1), 1.0 - kept.numel() / length)
