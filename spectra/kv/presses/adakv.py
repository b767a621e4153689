"""AdaKV (Feng et al. 2024, arXiv:2407.11550) as kvpress 0.5.5's `AdaKVPress(press, alpha_safeguard=0.2)`: the
scores of every key/value head of a layer compete for the layer's budget, so heads keep different numbers of tokens.

At ratio r a layer of L tokens and H_kv key/value heads keeps H_kv · n_kept tokens in all (n_kept = kvpress's
`compute_n_kept(L, r)`), as a uniform press would, but shared by score: each head first secures its n_safe =
max(1, int(n_kept · α)) best tokens (α = 0.2, the safeguard; their scores raised to the dtype's largest value), then
the H_kv · (L − n_kept) lowest scores over the whole layer are evicted (torch.topk over the flattened scores, as
kvpress picks them). The scores are the wrapped scorer's (`adakv(snapkv)`, `adakv(knorm)`, `adakv(tova)`, …), per
key/value head. kvpress keeps the evicted keys in its cache and hides them from attention with a fake key whose
weight underflows to zero; here they are dropped (`presses.per_head`), the same attention up to float rounding.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Wrapper, n_kept, per_head, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 70

#: kvpress's default alpha_safeguard: the share of n_kept each head keeps whatever the other heads score
SAFEGUARD = 0.2


def adaptive_keep(scores: torch.Tensor, keep: int, safeguard: float = SAFEGUARD) -> torch.Tensor:
    """(H_kv, L) bool: the tokens kept when the heads' `scores` (H_kv, L) compete for H_kv · `keep` tokens, each head
    keeping at least its max(1, int(keep · safeguard)) best (kvpress's AdaKVPress.compress)."""
    heads, length = scores.shape
    scores = scores.clone()
    safe = int(keep * safeguard)
    if safeguard > 0:
        safe = max(1, safe) if keep > 0 else 0
    secured = torch.topk(scores, safe, dim=-1).indices
    scores.scatter_(-1, secured, torch.finfo(scores.dtype).max)
    evicted = torch.topk(-scores.reshape(-1), heads * (length - keep)).indices
    kept = torch.ones(heads * length, dtype=torch.bool, device=scores.device)
    kept[evicted] = False
    return kept.view(heads, length)


@register
class AdaKV(Wrapper):
    """`adakv(<scorer>)`: the scorer's tokens, budgets shared by the heads of each layer (see the module docstring)."""

    name, summary = "adakv", "a scorer's best tokens, the layer's budget shared by its heads"
    guide = ("AdaKV (kvpress's `AdaKVPress`, `alpha_safeguard` 0.2) over any scorer ({scorers}): the scorer's scores "
             "of every key/value head of a layer compete for the layer's budget, so its heads keep different numbers "
             "of tokens, each at least a fifth of its even share. The ratio is the scorer's, the share of the layer's "
             "cached tokens removed: the layer keeps H_kv · int(L · (1 − r)) tokens in all, the bytes of the scorer at "
             "the same ratio. It needs no input beyond the scorer's name.")
    wraps, peer = "scorer", "AdaKVPress"

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        return per_head(prefill, adaptive_keep(self.scores(prefill, ratio), n_kept(prefill.length, ratio)))
