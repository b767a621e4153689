"""`lagkv`: kvpress 0.5.5's LagKVPress (LagKV, arXiv 2504.04704) at its defaults — each token scored by how much its
key and value stand out once normalised by the range of the *next* partition of the context, with no attention read.

Per key/value head, the L context tokens are cut into the first SINKS (attention sinks), then P = ⌊(L − SINKS)/LAG⌋
partitions of LAG tokens, then the rest. Partition i (0 ≤ i < P − 1) is scored against partition i + 1, its lag
reference: with m_c and M_c the smallest and largest value of channel c over the reference's LAG rows, token j of
partition i gets, for its key (and alike for its value),

    s_j = softmax over the LAG tokens of partition i of  std_c((x_jc − m_c) / (M_c − m_c))

(std with Bessel's correction over the d channels, as torch.std). The key's and the value's s_j are averaged, and the
token's score is its rank within its partition divided by LAG (kvpress's `cross_scoring=False`: argsort of argsort,
so every partition offers the same ladder of scores 0, 1/LAG, …, (LAG − 1)/LAG and the top n_kept take the best
ranks of every partition alike). The sinks and the last partition with what follows it (which has no reference)
score 1 and are always kept. A context shorter than SINKS + 2·LAG is not scored: the sinks score 1 and the tokens
after them (t / (L − SINKS)) for the t-th, so the most recent are kept — StreamingLLM's cache.

Ties are left to torch.topk exactly as kvpress leaves them (whole partitions share each score): the score tensor is
built with kvpress's operations in the cache's dtype. kvpress's experimental `cross_scoring` (the averaged softmax
as the score, for AdaKV) is not offered.
"""

from __future__ import annotations

import torch

from .base import Prefill, ScorerPress, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 35

#: kvpress 0.5.5's defaults: the attention sinks always kept (n_sink) and the partition size (lag_size)
SINKS, LAG = 4, 128


def partition_scores(states: torch.Tensor, lag: int) -> torch.Tensor:
    """(H_kv, P − 1, lag): for keys or values cut into P partitions, `states` (H_kv, P, lag, d), each token of the
    first P − 1 partitions scored against the channel ranges of the partition after it (the softmax over its
    partition of the normalised row's standard deviation across channels)."""
    reference, scored = states[:, 1:], states[:, :-1]
    low = reference.min(dim=-2, keepdim=True).values
    high = reference.max(dim=-2, keepdim=True).values
    return ((scored - low) / (high - low)).std(dim=-1).softmax(dim=-1)


@register
class LagKV(ScorerPress):
    """LagKV: tokens whose key and value vary most across channels relative to the next partition's range, ranked
    within their partition of LAG tokens; the SINKS first tokens and the last partition always kept (see the module
    docstring for the formula and the short-context rule)."""

    name, summary = "lagkv", "keys and values that stand out against the next partition's range"
    peer = "LagKVPress"
    rowscorer = True

    def __init__(self, sinks: int = SINKS, lag: int = LAG) -> None:
        self.sinks, self.lag = sinks, lag

    def fresh(self) -> LagKV:
        return type(self)(self.sinks, self.lag)

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        key, value = prefill.key, prefill.value
        heads, length, dim = key.shape
        sinks, lag = self.sinks, self.lag
        if length < sinks + 2 * lag:  # too short to score: the sinks and the most recent tokens
            scores = torch.ones(heads, length, dtype=key.dtype, device=key.device)
            if length > sinks:
                recent = torch.arange(length - sinks, device=key.device) / (length - sinks)
                scores[:, sinks:] = recent.to(key.dtype)
            return scores
        end = sinks + (length - sinks) // lag * lag

        def cut(states: torch.Tensor) -> torch.Tensor:
            return states[:, sinks:end].reshape(heads, -1, lag, dim)

        mean = (partition_scores(cut(key), lag) + partition_scores(cut(value), lag)) / 2
        ranks = (mean.argsort(dim=-1).argsort(dim=-1) / lag).to(key.dtype)
        kept = torch.ones(heads, 1, dtype=ranks.dtype, device=ranks.device)
        return torch.cat((kept.expand(-1, sinks), ranks.reshape(heads, -1), kept.expand(-1, lag + length - end)), -1)
