"""CriticalAdaKV (Feng et al. 2025, arXiv:2502.03805) as kvpress 0.5.5's `CriticalAdaKVPress(press,
alpha_safeguard=0.2, epsilon=1e-4, first_stage_ratio=0.5)`: AdaKV's budgets shared by the heads of a layer, each head
then filling its budget in CriticalKV's two stages.

At ratio r, with n_kept = max(1, int(L·(1 − r))) and the wrapped scorer's scores s (H_kv, L):

1. each head secures its n_safe = max(1, int(n_kept·0.2)) best tokens (their scores raised to the dtype's largest
   value), and the H_kv·n_kept best of the layer's scores set each head's budget b_h (AdaKV: `adakv.adaptive_keep`,
   whose kept count per head is that budget);
2. the first stage raises each head's int(b_h·0.5) best (secured ones included) to the largest value;
3. the second stage weighs the scores, (s + ε)·n with ε = 1e-4 and n the value norms through W^O of `criticalkv`,
   and each head keeps its b_h best.

So the heads keep different numbers of tokens, H_kv·n_kept in all (the bytes of the scorer at the same ratio), and
which tokens within each budget is CriticalKV's choice. kvpress hides the evicted tokens from attention behind a key
whose weight underflows to zero; here they are dropped (`presses.per_head`), the same attention up to rounding.
"""

from __future__ import annotations

import torch

from .adakv import SAFEGUARD, adaptive_keep
from .base import Compressed, Prefill, Wrapper, n_kept, per_head, register
from .criticalkv import EPSILON, FIRST_STAGE, raise_best, value_norms, weighed

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 74


def critical_adaptive_keep(scores: torch.Tensor, norms: torch.Tensor, keep: int, safeguard: float = SAFEGUARD,
                           share: float = FIRST_STAGE, epsilon: float = EPSILON) -> torch.Tensor:
    """(H_kv, L) bool: the tokens CriticalAdaKV keeps given the scorer's `scores` and the value `norms` (H_kv, L),
    `keep` tokens per head on average (see the module docstring)."""
    budgets = adaptive_keep(scores, keep, safeguard).sum(dim=-1).tolist()
    safe = max(1, int(keep * safeguard)) if safeguard > 0 and keep > 0 else 0
    secured = raise_best(scores, [safe] * scores.shape[0])
    staged = raise_best(secured, [int(budget * share) for budget in budgets])
    final = weighed(staged, norms, epsilon)
    best = torch.topk(final, max(budgets), dim=-1, sorted=True).indices
    kept = torch.zeros_like(scores, dtype=torch.bool)
    for head, budget in enumerate(budgets):
        kept[head, best[head, :budget]] = True
    return kept


@register
class CriticalAdaKV(Wrapper):
    """`criticaladakv(<scorer>)`: AdaKV's per-head budgets filled in CriticalKV's two stages (see the module
    docstring)."""

    name, summary = "criticaladakv", "AdaKV's per-head budgets filled by CriticalKV's two stages"
    peer = "CriticalAdaKVPress"
    guide = ("CriticalAdaKV (kvpress's `CriticalAdaKVPress`, `alpha_safeguard` 0.2, `epsilon` 1e-4, "
             "`first_stage_ratio` 0.5) over any scorer ({scorers}): the heads of a layer share its budget as in "
             "`adakv(<scorer>)`, and each head fills its share as `criticalkv(<scorer>)` does, half by the scorer "
             "alone, half by the score times its value's norm through the output projection. The ratio is the "
             "scorer's, the share of the layer's cached tokens removed: the layer keeps H_kv · int(L · (1 − r)) "
             "tokens in all, the bytes of the scorer at the same ratio. It needs no input beyond the scorer's name.")
    wraps = "scorer"

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        keep = critical_adaptive_keep(self.scores(prefill, ratio), value_norms(prefill, self.name),
                                      n_kept(prefill.length, ratio))
        return per_head(prefill, keep)
