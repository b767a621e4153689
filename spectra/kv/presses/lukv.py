"""LU-KV (Predicting Future Utility: Global Combinatorial Optimization for Task-Agnostic KV Cache Eviction, arXiv:
2602.08585) as kvpress 0.5.5's `LUKVPress` at its defaults: Expected Attention's scores (epsilon 2e-2) ranked within
each key/value head, but each head keeping its own share of the cache — a budget allocated offline, for one model and
one scorer, to the layers and heads whose kept tokens matter most, rather than the same n_kept everywhere.

`lukv(FILE)` reads that allocation, the budget curve (`spectra.kv.budgetcurve`: a `.npy` array (99, layers, H_kv)
of prune ratios, row i for the target ratio (i + 1) %), from FILE — kvpress downloads it from the LU-KV repository
and publishes one, for Llama-3.1-8B-Instruct; spectra reads no network. At ratio r, layer ℓ reads the row
round(100 r) − 1 (clamped to 0 … 98): head h's prune ratio p_h gives its ideal count c_h = clamp(1 − p_h, 0, 1) · L
(float32); the layer keeps T = round(Σ_h c_h) tokens in all (between H_kv and H_kv · L), each head ⌊c_h⌋ and the T −
Σ⌊c_h⌋ left over going one each to the heads with the largest fractional parts (torch.topk), each head at least 1.

Scores: kvpress's ExpectedAttentionPress(epsilon=2e-2) (`expected.expected_scores`, its first 4 tokens already
raised), then the first `SINK` and the last `RECENT` tokens raised to the layer's largest score + 1, so no curve
evicts them; each head keeps its c_h best by a stable descending sort. Heads keep different counts
(`presses.per_head`); kvpress masks the evicted keys in its attention instead, the same attention up to float
rounding. The ratio picks only the curve's row: what is saved is what the curve prunes, 1 − Σ c_h / (H_kv · L).
"""

from __future__ import annotations

import numpy as np
import torch

from ..budgetcurve import read, row
from .base import Compressed, Prefill, Press, full, per_head, register
from .expected import expected_scores

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 79

#: kvpress's defaults: the first and last tokens never evicted (`sink`, `window`) and the scorer's epsilon
SINK, RECENT, EPSILON = 4, 1, 2e-2


def head_counts(prune: torch.Tensor, length: int) -> torch.Tensor:
    """(H_kv,) the tokens each key/value head keeps of `length`, given its prune ratios `prune` (H_kv,) float32 (the
    module docstring; kvpress's rounding: the layer's total rounded, the remainder to the largest fractions)."""
    heads = prune.shape[0]
    ideal = (1.0 - prune).clamp(min=0.0, max=1.0) * length
    total = max(heads, min(heads * length, int(torch.round(ideal.sum()).item())))
    counts = torch.floor(ideal).long()
    remainder = total - int(counts.sum().item())
    if remainder > 0:
        counts[torch.topk(ideal - counts, k=min(remainder, heads)).indices] += 1
    return counts.clamp_(min=1, max=length)


def protected(scores: torch.Tensor, sink: int = SINK, recent: int = RECENT) -> torch.Tensor:
    """`scores` (H_kv, L) with the first `sink` and the last `recent` tokens raised to their largest + 1."""
    scores = scores.clone()
    top = scores.max().item() + 1
    length = scores.shape[-1]
    if sink > 0:
        scores[..., :min(sink, length)] = top
    if recent > 0:
        scores[..., max(0, length - recent):] = top
    return scores


def ranked_keep(scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(H_kv, L) bool: each head's `counts` best tokens by `scores` (H_kv, L), torch's stable descending sort."""
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    rank = torch.arange(scores.shape[-1], device=scores.device).expand_as(order)
    keep = torch.zeros_like(scores, dtype=torch.bool)
    return keep.scatter_(-1, order, rank < counts.to(scores.device)[:, None])


@register
class LUKV(Press):
    """`lukv(FILE)`: Expected Attention's tokens, each head keeping what the LU-KV budget curve in FILE allots it
    (see the module docstring)."""

    name, summary = "lukv", "Expected Attention's tokens, per-head budgets from an LU-KV curve"
    peer = "LUKVPress"
    guide = ("LU-KV (kvpress's `LUKVPress` at its defaults: ExpectedAttentionPress(epsilon=2e-2), the first 4 and the "
             "last token always kept) given a budget curve: a `.npy` array of shape (99, layers, key/value heads), "
             "row i the share of each head's cache to prune at the target ratio (i + 1) %, which the LU-KV "
             "repository's `generate_curve.sh` computes for one model and scorer (kvpress downloads its one curve, "
             "for Llama-3.1-8B-Instruct). Each head keeps its own count, the layer's total rounded as kvpress rounds "
             "it; the ratio only picks the curve's row (round(100 · r) − 1), so the memory saved is the curve's.")
    argument, check = "curve", "spectra.kv.budgetcurve:check"
    ratio_means = "the row of its budget curve, round(100 · r) − 1, which sets the share each head prunes"
    needs_rope, reads, min_context = True, ("query_pre",), 5  # Expected Attention's

    def __init__(self, curve: np.ndarray | None = None, where: str = "") -> None:
        self.curve, self.where = curve, where
        if curve is not None:
            self.name = f"lukv({where})"  # type: ignore[misc]

    def bind(self, argument: str) -> LUKV:
        """The press reading the budget curve in the file `argument`."""
        return LUKV(read(argument), argument)

    def fresh(self) -> Press:
        return self

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        if self.curve is None:
            raise ValueError("lukv needs a budget curve: name it as lukv(<file.npy>)")
        _, layers, kv_heads = self.curve.shape
        if layers <= prefill.layer or kv_heads != prefill.kv_heads:
            raise ValueError(f"the budget curve {self.where} is {layers} × {kv_heads}; layer {prefill.layer} has "
                             f"{prefill.kv_heads} key/value heads")
        prune = torch.as_tensor(self.curve[row(ratio), prefill.layer], dtype=torch.float32)
        counts = head_counts(prune, prefill.length)
        if bool((counts >= prefill.length).all()):
            return full(prefill)
        scores = protected(expected_scores(prefill, epsilon=EPSILON))
        return per_head(prefill, ranked_keep(scores, counts))
