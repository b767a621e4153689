"""A spectrum-guided per-head budget: each key/value head keeps a number of tokens proportional to what its attention
was measured to need (`spectra.anatomy.headweights`: exp(entropy) or the rank of P, from an `analyze` or `heads` run), the
total over every layer and head that of the uniform press at the same ratio — so the cache holds exactly as many
bytes (every kept token costs each head the same key and value rows).

At ratio r and L context tokens the model keeps N_layers · H_kv · n_kept(L, r) tokens in all. Head (ℓ, h) gets the
share w_ℓh / Σw of them, capped at the whole context with the surplus handed to the other heads in proportion
(`schedules.water_fill`), in whole tokens by largest remainders (`schedules.whole_tokens`), at least one each. Which
tokens a head keeps is SnapKV's choice (the attention of the last 64 context queries, the window always kept): the
budget says how many, the scorer which. `headbudget(DIR)` weighs by entropy, `headbudget(DIR@rank)` by rank.

On a model with sliding-window layers (Gemma 3) a local layer keeps its window whatever the press (`kv.cell.local`),
so the run hands the press the layers' windows (`for_run(windows=…)`) and the budget N_global · H_kv · n_kept(L, r)
is shared by the global layers' heads alone: the uniform press's bytes, as on a model without windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

from ...anatomy import headweights
from .base import Compressed, Prefill, Press, n_kept, per_head, register
from .eviction import SnapKV
from .schedules import water_fill, whole_tokens

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 80


def head_budgets(weights: np.ndarray, length: int, ratio: float, local: Sequence[bool] | None = None) -> np.ndarray:
    """(layers, H_kv) whole tokens kept per head ∝ `weights`, adding up to layers · H_kv · n_kept(length, ratio) —
    over the global layers only where `local` marks a model's sliding-window layers (they keep their window
    whatever the press: 0 here, and the global layers share what the uniform press keeps in them)."""
    compressed = np.ones(len(weights), dtype=bool) if local is None else ~np.asarray(local, dtype=bool)
    found = np.zeros(weights.shape, dtype=np.int64)
    chosen = weights[compressed]
    if chosen.size:
        total = chosen.size * n_kept(length, ratio)
        shares = water_fill(chosen.ravel(), total / length)
        found[compressed] = np.asarray(whole_tokens(shares, length, total)).reshape(chosen.shape)
    return found


@register
class HeadBudget(Press):
    """`headbudget(DIR[@measure])`: SnapKV's tokens, as many per head as its measured need (module docstring)."""

    name, summary = "headbudget", "SnapKV's tokens, each head's count from its measured entropy or rank"
    peer = ""
    guide = ("spectra's own per-head budget: each key/value head keeps a number of tokens in proportion to what a "
             "finished `spectra analyze` or `spectra heads` run of the same model measured its attention to need — "
             "exp(entropy) by default, the rank of P for 90% of its nuclear norm with `headbudget(<run>@rank)` — and "
             "SnapKV's scores choose which tokens. The ratio is an eviction ratio: the total over every layer and head "
             "is the uniform press's at the same ratio (the same bytes), shared out by measured need, a head capped "
             "at the whole context; on a model with sliding-window layers (Gemma 3) the global layers share the uniform "
             "press's total in them, a local layer keeping its window. Like `snapkv` it needs a `--context` above 64.")
    windowed, across_layers = True, True  # its budget: the total over every (global) layer's heads
    argument, check = "run", "spectra.anatomy.headweights:check"

    def __init__(self, weights: np.ndarray | None = None, where: str = "",
                 local: tuple[bool, ...] | None = None) -> None:
        self.weights, self.where, self.local = weights, where, local
        if weights is not None:
            self.name = f"headbudget({where})"  # type: ignore[misc]
        self._budgets = lru_cache(maxsize=16)(self._compute)

    def bind(self, argument: str) -> HeadBudget:
        return HeadBudget(headweights.read(argument), argument)

    def for_run(self, windows: Sequence[int | None] | None = None, **settings: object) -> HeadBudget:
        """This press for a run of a model whose layers have these sliding `windows` (the run's setting; None or no
        window: every layer global): a local layer keeps its window whatever the press, so the budget is shared by
        the global layers alone, the total the uniform press keeps in them."""
        if self.weights is None or not windows or not any(window is not None for window in windows):
            return self
        return HeadBudget(self.weights, self.where, tuple(window is not None for window in windows))

    def _compute(self, length: int, ratio: float) -> np.ndarray:
        local = self.local if self.local is not None and len(self.local) == len(self.weights) else None
        return head_budgets(self.weights, length, ratio, local)

    def budgets(self, length: int, ratio: float) -> np.ndarray:
        """(layers, H_kv) tokens each head keeps at this length and ratio."""
        if self.weights is None:
            raise ValueError("headbudget needs a run: name it as headbudget(<analyze or heads run>)")
        return self._budgets(length, ratio)

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        if self.weights is not None and (self.weights.shape[0] <= prefill.layer
                                         or self.weights.shape[1] != prefill.kv_heads):
            raise ValueError(f"the run {self.where} measured {self.weights.shape[0]} layers × "
                             f"{self.weights.shape[1]} key/value heads; layer {prefill.layer} has {prefill.kv_heads}")
        counts = self.budgets(prefill.length, ratio)[prefill.layer]
        scores = SnapKV().score(prefill, ratio)
        order = torch.argsort(scores, dim=-1, descending=True, stable=True)
        ranks = torch.empty_like(order).scatter_(1, order, torch.arange(prefill.length, device=order.device)
                                                 .expand_as(order))
        keep = ranks < torch.as_tensor(counts, device=ranks.device)[:, None]
        return per_head(prefill, keep)
