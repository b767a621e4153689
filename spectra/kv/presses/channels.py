"""Presses along the head dimension: ThinK (kvpress 0.5.5's ThinKPress at its defaults).

ThinK never evicts a token: per key/value head it zeroes the fraction r of key channels with the smallest
Q_c·K_c, where Q_c = mean over the last 32 context queries (post-RoPE, averaged over the group) of q_c² and
K_c = mean over the L context keys of k_c² (post-RoPE). The zeros are written into the context's cached keys only;
keys the continuation adds keep every channel. kvpress reports r/2 as its compression ratio (keys are half the
cache), although a cache of zeroed channels saves nothing until it is stored narrower; `stored` counts the cache
stored narrower: per key/value head the L × (d − pruned) kept key channels, the L × d values, and a bitmask of the
kept channels (⌈d/8⌉ bytes).
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Press, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 20

#: the queries ThinK reads: the last 32 context positions
QUERIES = 32


def channel_scores(prefill: Prefill) -> torch.Tensor:
    """(H_kv, d): Q_c·K_c per key/value head and key channel."""
    queries = prefill.q[:, -QUERIES:].pow(2).mean(dim=1)  # (H, d)
    return prefill.group_mean(queries) * prefill.key.pow(2).mean(dim=1)


@register
class ThinK(Press):
    """ThinK: the int(d·r) lowest-scoring key channels of each key/value head set to 0 in the context's keys."""

    name, summary = "think", "key channels with the largest query·key energy"
    peer = "ThinKPress"
    needs_rope, axis = True, "channels"
    ratio_means = "the share of key channels removed (half of it saved: keys are half the cache)"

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        pruned = int(prefill.head_dim * ratio)
        dropped = channel_scores(prefill).topk(pruned, dim=-1, largest=False).indices  # (H_kv, pruned)
        key = prefill.key.clone()
        key.scatter_(-1, dropped[:, None, :].expand(-1, prefill.length, -1), 0)
        every = torch.arange(prefill.length, device=key.device).expand(prefill.kv_heads, -1)
        itemsize, length = prefill.key.element_size(), prefill.length
        stored = (length * (prefill.head_dim - pruned + prefill.value.shape[-1]) * itemsize
                  + -(-prefill.head_dim // 8))
        return Compressed(every, pruned / prefill.head_dim / 2, key=key,
                          stored=torch.full((prefill.kv_heads,), stored, dtype=torch.int64))
