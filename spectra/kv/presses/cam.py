"""kvpress 0.5.5's CAMPress: Cache Merging (CaM) while decoding — evicted values merged into the kept rows after them.

CaM (Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference", ICML 2024,
https://openreview.net/forum?id=LCTmppB165) observes that evicting a cached token perturbs the attention output by
the share of attention it still receives; instead of dropping its value it adds it, scaled, to the values of the
tokens that follow it, which then carry what it contributed. kvpress's CAMPress applies this to a DecodingPress:
`cam(<decodable>)` (e.g. `cam(knorm)`) compresses nothing after the prefill, and every `interval` decoding steps
(`--compression-interval`, kvpress's compression_interval, 512 by default) brings each layer's cache back to
`target` = n_kept(L, ratio) rows (kvpress's absolute `target_size`, derived as `decoding(…)` derives it):

1. Running attention. After every decoding step's attention in a layer, the step's last query's attention over
   every cached row (its own included; softmax in float32, averaged over the query heads of each key/value head)
   is added to a per-layer running sum A (H_kv, M), new rows entering at 0 — kept by `generation.Recompression`
   (`merges`), pruned with the cache.
2. Score and select. The scorer scores every row as for `decoding(…)` (`DecodingPress.scores`); the scores are
   averaged over key/value heads (one choice for all heads). The M − target rows of lowest mean score are evicted,
   the `target` highest kept (two torch.topk calls, as kvpress makes them), both in position order.
3. Merge candidates. Of the evicted rows the k of highest score merge, k the steps since the last compression
   (ties to the later row); each one's window is the `merge_budget` (32) kept rows after it (fewer near the end).
4. Merge draws. Per key/value head, p = clamp(A_i / mean(A over the window), 0, 1) (0/0 → 0, x/0 → 1), and a
   Bernoulli draw with probability p decides whether row i's value, divided by the window's size, is added to each
   value of its window (kvpress draws from torch's global generator; spectra from one generator per sequence,
   seeded `Cam.seed_of(seed, index)`, drawn layer by layer, compression by compression, as kvpress's would be after
   torch.manual_seed of that seed before the sequence).
5. The kept rows (keys and merged values) stay in position order (kvpress gathers them sorted).

kvpress also only compresses a due layer whose cache holds more than `target` rows; spectra's caches always do
when due (the context holds L ≥ target rows and every step adds one), so the step count resets as decoding(…)'s.
The scorers are the decodable ones (kvpress accepts any ScorerPress; it hands them the buffered hidden states,
which only decodable scorers read as spectra does).
"""

from __future__ import annotations

import torch

from ...seeds import Domain, derive_seed
from .base import register
from .decoding import DecodingPress

#: where this file's presses come in listings (after the decoding presses)
ORDER = 93


@register
class Cam(DecodingPress):
    """`cam(<decodable>)`: `decoding(<decodable>)` whose evicted rows' values are merged, by Bernoulli draws, into
    the kept rows after them (see the module docstring)."""

    name, summary = "cam", "kept while decoding, evicted values merged into later kept rows"
    peer = "CAMPress"
    guide = ("kvpress's CAMPress over a decodable scorer ({decodables}): decoding(…) that, at each compression, adds "
             "the values of the evicted rows of highest score (one per step since the last compression), scaled by "
             "a Bernoulli draw on their running attention, to the 32 kept rows after each; its ratio is the "
             "eviction ratio of its target, as decoding(…)'s.")
    merges, merge_budget = True, 32

    @staticmethod
    def seed_of(seed: int, index: int) -> int:
        """The seed of sequence `index`'s merge draws in a run seeded `seed` (torch.manual_seed's for kvpress)."""
        return derive_seed(seed, Domain.CAM_MERGE, index)

    def merge_keep(self, layer: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                   target: int, attention: torch.Tensor, steps: int, generator: torch.Generator, seed: int = 0,
                   index: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """One compression of a layer's cache key, value (H_kv, M, d) to `target` rows, or None when M ≤ target:
        the rows kept (H_kv, target) in position order, their values after the merge (H_kv, target, d) and the
        running attention `attention` (H_kv, M) at them. `steps`: decoding steps since the last compression (the
        merge candidates); `generator`: the sequence's merge draws; the rest as `DecodingPress.keep`."""
        rows = key.shape[-2]
        if rows <= target:
            return None
        mean = self.scores(layer, q, key, value, scaling, target, seed, index).mean(dim=0)
        evicted = torch.sort(torch.topk(mean, rows - target, largest=False).indices).values
        kept = torch.sort(torch.topk(mean, target).indices).values
        later_first = torch.argsort(mean[evicted].flip(-1), descending=True, stable=True)[:steps]
        merging = torch.sort(evicted[rows - target - 1 - later_first]).values
        merged = merge(value, attention, kept, merging, self.merge_budget, generator)
        heads = key.shape[0]
        return kept.expand(heads, -1), merged[:, kept], attention[:, kept]


def merge(value: torch.Tensor, attention: torch.Tensor, kept: torch.Tensor, merging: torch.Tensor, budget: int,
          generator: torch.Generator) -> torch.Tensor:
    """A copy of value (H_kv, M, d) where each row of `merging` (sorted) has, per head, with probability
    clamp(A_i / mean A over its window, 0, 1), its value / |window| added to every row of its window: the first
    `budget` rows of `kept` (sorted) after it. `attention` A (H_kv, M): the running attention."""
    heads, dim = value.shape[0], value.shape[-1]
    count = merging.shape[-1]
    window = torch.searchsorted(kept, merging, right=True)[:, None] + torch.arange(budget, device=kept.device)
    inside = window < kept.shape[-1]
    targets = kept[window.clamp(max=kept.shape[-1] - 1)]  # (count, budget) rows
    sizes = inside.sum(dim=-1)  # (count,)
    window_mean = (attention[:, targets] * inside).sum(dim=-1) / sizes.clamp(min=1)
    probability = attention[:, merging] / window_mean
    probability = torch.where(torch.isnan(probability), torch.zeros_like(probability), probability)
    probability = torch.where(torch.isinf(probability), torch.ones_like(probability), probability).clamp(0, 1)
    drawn = torch.bernoulli(probability, generator=generator)  # (H_kv, count)
    scale = torch.where(sizes == 0, torch.zeros_like(drawn), drawn / sizes)[..., None]
    shares = (value[:, merging] * scale)[:, :, None, :].expand(-1, -1, budget, -1) * inside[None, :, :, None]
    where = targets.reshape(1, count * budget, 1).expand(heads, -1, dim)
    return value.clone().scatter_add_(1, where, shares.reshape(heads, count * budget, dim))


def step_attention(q: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """The attention (H_kv, n, M) of n queries q (H, n, d) over M rows key (H_kv, M, d) whose last n are theirs
    (causal among them): per query head a softmax in float32 (or wider) cast back, averaged over the query heads of
    each key/value head — what kvpress's CAMPress adds to its running sum at a decoding step (one query each)."""
    heads, n, dim = q.shape
    kv_heads, rows = key.shape[0], key.shape[-2]
    group = heads // kv_heads
    scores = torch.matmul(q.reshape(kv_heads, group * n, dim), key.transpose(-1, -2)).view(heads, n, rows)
    scores = scores * scaling
    if n > 1:
        hidden = torch.ones(n, rows, dtype=torch.bool, device=q.device).triu(rows - n + 1)
        scores = scores.masked_fill(hidden, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    return weights.view(kv_heads, group, n, rows).mean(dim=1)


def accumulate(running: torch.Tensor | None, q: torch.Tensor, key: torch.Tensor, scaling: float,
               every: bool) -> torch.Tensor:
    """The running attention sum (H_kv, M) after a pass of queries q (H, n, d) over key (H_kv, M, d) (their rows
    last): `running` (H_kv, M' ≤ M; None: none yet) padded with zeros for the new rows, plus the attention of each
    query in turn when `every` (a teacher-forced pass of n decoding steps), else of the last (one step)."""
    attention = step_attention(q if every else q[:, -1:], key, scaling)
    kv_heads, rows = key.shape[0], key.shape[-2]
    total = attention.new_zeros(kv_heads, rows) if running is None else torch.cat(
        [running, running.new_zeros(kv_heads, rows - running.shape[-1])], dim=-1)
    first = running is None
    for step in range(attention.shape[1]):
        if first:
            total, first = attention[:, step].clone(), False
        else:
            total += attention[:, step]
    return total
