"""CriticalKV (Feng et al. 2025, arXiv:2502.03805) as kvpress 0.5.5's `CriticalKVPress(press, epsilon=1e-4,
first_stage_ratio=0.5)`: a scorer's tokens, half the budget chosen by the scorer alone and the other half by its score
weighed by how much the token's value moves the layer's output.

Attention's output for a query is Σ_j P_j v_j W_O,h, so a token matters by its attention weight and by the size of
what its value writes through the output projection, ‖v_j W_O,hᵀ‖: the paper bounds the output's error by both.
Per query head h with key/value head g = h // G and W_O,h = W^O[:, h·d:(h+1)·d] (D × d, its columns of the output
projection), the value norm of token j is ‖v_{g,j} W_O,hᵀ‖₁ (the L1 norm over the D model dimensions), averaged over
the G query heads of each key/value head: n_{g,j}.

At ratio r a head of L tokens keeps n_kept = max(1, int(L·(1 − r))) (kvpress's `compute_n_kept`), in two stages:

1. the b₁ = max(1, int((1 − r)·L·0.5)) best tokens by the wrapped scorer's score s (kvpress's selection budget,
   computed from the float product as kvpress computes it: about half of n_kept);
2. the rest of n_kept by (s + ε)·n, ε = 1e-4 (the first stage's tokens raised to the dtype's largest value, so
   they stay).

Only the ranking inside each key/value head changes, so every head keeps n_kept tokens, as the scorer alone would.
The scorer's score is kept as it is, negative ones included (knorm's −‖k‖: a larger value norm then lowers it, as in
kvpress). The value norms are computed as kvpress computes them, one query head at a time in the cache's dtype.
"""

from __future__ import annotations

import weakref

import torch

from ...errors import SpectraError
from .base import Compressed, Prefill, Wrapper, evict, n_kept, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 72

#: kvpress's defaults: the score's shift before it is weighed, and the share of the budget the scorer alone fills
EPSILON, FIRST_STAGE = 1e-4, 0.5


#: each layer's value norms, computed once for every ratio and both presses of this family that read them (a sweep
#: asks 8 times per layer: 4 ratios × criticalkv, criticaladakv), and freed with the prefill they belong to
NORMS: weakref.WeakKeyDictionary[Prefill, torch.Tensor] = weakref.WeakKeyDictionary()


def value_norms(prefill: Prefill, name: str) -> torch.Tensor:
    """(H_kv, L): ‖v_{g,j} W_O,hᵀ‖₁ averaged over the query heads h of each key/value head g (kvpress's vwl1norm),
    in the cache's dtype, once per prefill (`NORMS`); `name` is the press asking, for the error where the prefill
    carries no W^O."""
    if prefill in NORMS:
        return NORMS[prefill]
    if prefill.w_o is None:
        raise SpectraError(f"{name} weighs each token by what its value writes through the layer's output projection "
                           "W^O, which spectra finds in no attention layer of this model (it looks for o_proj, "
                           "out_proj, output.dense, out_lin or dense); choose another press")
    heads, dim = prefill.q.shape[0], prefill.head_dim
    per_head = prefill.w_o.to(prefill.value.dtype).transpose(0, 1).view(heads, dim, -1)  # (H, d, D)
    norms = [torch.norm(prefill.value[head // prefill.groups].matmul(per_head[head]), p=1, dim=-1)
             for head in range(heads)]
    NORMS[prefill] = prefill.group_mean(torch.stack(norms))
    return NORMS[prefill]


def weighed(scores: torch.Tensor, norms: torch.Tensor, epsilon: float = EPSILON) -> torch.Tensor:
    """The second stage's scores (s + ε)·n, (H_kv, L)."""
    return (scores + epsilon) * norms


def raise_best(scores: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """`scores` (H_kv, L) with each head's `counts[h]` best raised to the dtype's largest value (a new tensor): the
    tokens a stage secures, ranked above every other (torch.topk's choice among equal scores, as kvpress's)."""
    raised = scores.clone()
    best = torch.topk(raised, max(counts), dim=-1, sorted=True).indices
    for head, count in enumerate(counts):
        raised[head].scatter_(-1, best[head, :count], torch.finfo(raised.dtype).max)
    return raised


def first_stage(length: int, ratio: float, share: float = FIRST_STAGE) -> int:
    """kvpress's selection budget: int((1 − r)·L·share), at least 1 while anything is kept."""
    budget = int((1 - ratio) * length * share)
    if share > 0:
        budget = max(1, budget) if ratio < 1.0 else 0
    return budget


def critical_scores(scores: torch.Tensor, norms: torch.Tensor, length: int, ratio: float) -> torch.Tensor:
    """(H_kv, L) CriticalKV's final scores from the scorer's `scores` and the `norms` of `value_norms`: the first
    stage's tokens at the dtype's largest value, the others weighed (see the module docstring)."""
    stage = torch.topk(scores, first_stage(length, ratio), dim=-1, sorted=True).indices
    return weighed(scores, norms).scatter_(-1, stage, torch.finfo(scores.dtype).max)


@register
class CriticalKV(Wrapper):
    """`criticalkv(<scorer>)`: the scorer's best half of the budget, the rest by its score weighed by the value norms
    through W^O (see the module docstring)."""

    name, summary = "criticalkv", "a scorer's best tokens, half of them weighed by their values' output norm"
    peer = "CriticalKVPress"
    guide = ("CriticalKV (kvpress's `CriticalKVPress`, `epsilon` 1e-4, `first_stage_ratio` 0.5) over any scorer "
             "({scorers}): half of each head's budget goes to the scorer's best tokens, the other half to the best "
             "by the score times what the token's value writes through the layer's output projection (the L1 norm "
             "of v·W_Oᵀ, averaged over the query heads of the key/value head). The ratio is the scorer's, the share "
             "of the cached tokens removed: every head keeps int(L · (1 − r)) tokens, the bytes of the scorer at the "
             "same ratio. It needs no input beyond the scorer's name.")
    wraps = "scorer"

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        scores = self.scores(prefill, ratio)
        final = critical_scores(scores, value_norms(prefill, self.name), prefill.length, ratio)
        return evict(prefill, final, n_kept(prefill.length, ratio))
