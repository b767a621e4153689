"""Merge-on-evict (kvpress 0.5.5's `MergingPress`, after Token Merging, Bolya et al. 2023, arXiv:2210.09461, and
D2O, Wan et al. 2024, arXiv:2406.13035): evict what a scorer evicts, but fold each evicted token's value into the
kept token whose key points the most the same way, so what the evicted tokens carried is not lost altogether.

`merging(<scorer>)` keeps the scorer's n_kept = max(1, int(L · (1 − r))) best tokens per key/value head, as the
scorer alone would, with their keys untouched (so RoPE positions stay right). Each evicted token e picks its target
t(e), the kept token of its head whose key has the largest cosine with its own (keys in float32, each scaled by
1 / max(‖k‖, 1e-6)), and merges when that cosine c_e reaches the threshold (0, kvpress's `similarity_threshold`);
its weight is w_e = max(c_e, 0) · ‖v_e‖ / (‖v_e‖ + ‖v_t‖ + 1e-6) (value norms in float32). A kept token t that
received any weight gets the value

    v_t ← (v_t + Σ_{e: t(e)=t} w_e v_e) / (1 + Σ_{e: t(e)=t} w_e),

accumulated in float32 and cast back to the cache's dtype; the others keep theirs. So a target keeps at least half
of its own value when one token merges into it, and an evicted token whose value is small next to its target's
barely moves it. kvpress's `merge_fraction` (1.0: every evicted token merges) is the default taken here.

As kvpress computes it: the kept tokens in torch.topk's order, the evicted ones in position order, the cosines one
matrix product, the contributions scatter-added in position order of the evicted tokens; the kept rows are then
listed in position order (attention does not depend on their order). What it stores is the eviction's: n_kept rows
of keys and values per head (`Compressed.value` holds the merged values beside the kept positions).
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Wrapper, n_kept, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 78

#: kvpress's ε of the key and value norms, and its defaults: similarity_threshold, merge_fraction
EPSILON, THRESHOLD, FRACTION = 1e-6, 0.0, 1.0


def merge_values(key: torch.Tensor, value: torch.Tensor, kept: torch.Tensor, threshold: float = THRESHOLD,
                 fraction: float = FRACTION) -> torch.Tensor:
    """(H_kv, m, d) the values of the kept rows `kept` (H_kv, m) of `key`, `value` (H_kv, L, d), listed as `kept`
    lists them, with every other row's value merged into its most cosine-similar kept row (the module docstring);
    `threshold`: the least cosine that merges, `fraction`: the share of the evicted rows, by cosine, that merge."""
    heads, length, dim = key.shape
    head = torch.arange(heads, device=key.device)[:, None]  # rows picked by advanced indexing (a plain copy, faster
    kept_values = value[head, kept]  # than gather on an expanded index)
    evicted_count = length - kept.shape[-1]
    if evicted_count == 0:
        return kept_values
    evicted_mask = torch.ones(heads, length, dtype=torch.bool, device=key.device).scatter_(1, kept, False)
    evicted = evicted_mask.nonzero()[:, 1].view(heads, evicted_count)  # position order

    def unit(rows: torch.Tensor) -> torch.Tensor:
        rows = key[head, rows].float()
        return rows / rows.norm(dim=-1, keepdim=True).clamp(min=EPSILON)

    similarity, target = (unit(evicted) @ unit(kept).transpose(-1, -2)).max(dim=-1)  # (H_kv, L − m)
    merges = similarity >= threshold
    if fraction < 1.0 and bool(merges.any()):  # only the best `fraction` of the candidates, by similarity
        floor = similarity.masked_fill(~merges, float("-inf")).quantile(1.0 - fraction, dim=-1, keepdim=True)
        merges = merges & (similarity >= floor)
    evicted_values = value[head, evicted].float()
    target_norm = kept_values.float().norm(dim=-1).gather(1, target)
    evicted_norm = evicted_values.norm(dim=-1)
    weights = similarity.clamp(min=0) * merges.float() * evicted_norm / (evicted_norm + target_norm + EPSILON)
    summed = torch.zeros(heads, kept.shape[-1], value.shape[-1], dtype=torch.float32, device=value.device)
    summed.scatter_add_(1, target[..., None].expand_as(evicted_values), weights[..., None] * evicted_values)
    total = torch.zeros(heads, kept.shape[-1], dtype=torch.float32, device=value.device).scatter_add_(1, target,
                                                                                                      weights)
    merged = ((kept_values.float() + summed) / (1.0 + total)[..., None]).to(value.dtype)
    return torch.where((total > 0)[..., None], merged, kept_values)


@register
class Merging(Wrapper):
    """`merging(<scorer>)`: the scorer's kept tokens, each evicted token's value merged into its most similar kept
    token's (see the module docstring)."""

    name, summary = "merging", "a scorer's best tokens, the evicted values merged into them"
    guide = ("kvpress's `MergingPress` (similarity_threshold 0, merge_fraction 1) over any scorer ({scorers}): the "
             "scorer keeps its int(L · (1 − r)) best tokens per key/value head, and each evicted token's value is "
             "folded into the kept token whose key is most cosine-similar to its own, weighted by that cosine and "
             "by its share of the two value norms; keys are untouched. It stores what the scorer stores at the same "
             "ratio and needs no input beyond the scorer's name.")
    wraps, peer = "scorer", "MergingPress"

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        keep = n_kept(prefill.length, ratio)
        chosen = torch.topk(self.scores(prefill, ratio), keep, dim=-1).indices  # kvpress's order, for its rounding
        values = merge_values(prefill.key, prefill.value, chosen)
        kept, order = chosen.sort(dim=-1)
        return Compressed(kept, 1.0 - keep / prefill.length,
                          value=values.gather(1, order[..., None].expand(-1, -1, values.shape[-1])))
