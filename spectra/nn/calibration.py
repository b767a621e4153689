"""Calibration data for fitted methods: one layer's own q, k, v, and how far eq. 7 is from it.

`Calibration` holds a frozen model's captured q, k, v of some sequences (S, H, n, d) for one layer, their
valid keys, the score scale and whether attention is causal, and the target every fitted method is judged
against, the layer's own head output P V; `head_output_error` is the objective every fitted projection is judged by,
‖P V − softmax(Q (E K)ᵀ s)(F V)‖²_F / ‖P V‖²_F per (sequence, head) over valid rows (its square root is the
`out_err` of `spectra approx`); `pooling_projections` is the start every fit can only improve on: E = F = M,
mean pooling over k windows, with equal windows exactly the `pool-mean` method. Memory: a layer's
calibration holds q, k, v and P V, 4·S·H·n·d numbers (16·S·H·n·d bytes in float32: 400 MB for 64 sequences
of a BERT-base layer, H = 12, n = 512, d = 64). `nn.fit` builds PCA and fitted projections from these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from ..capture import Captured
from ..config import Sharing, check_budget, choose
from ..errors import SpectraError
from ..kernels import allowed, eq7, masked_softmax, scores
from .projections import Projections, distinct_keys

#: sequences per forward/backward pass: bounds the memory, not the result (sums are taken in order)
CHUNK = 8


@dataclass
class Calibration:
    """One layer's calibration tensors: q, k, v (S, H, n, d) float32 or float64, valid keys (S, n) bool, the
    score scale s and whether attention is `causal` (each query sees the valid keys at or before it). k, v are
    per query head (grouped-query keys repeated). Padded positions may hold anything: they are masked
    everywhere. Whether a method may be fitted on causal attention is the method's to say."""

    layer: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor
    scaling: float
    causal: bool = False

    def __post_init__(self) -> None:
        if not (self.q.dim() == 4 and self.q.shape == self.k.shape == self.v.shape):
            raise SpectraError(f"calibration q, k, v must share one shape (S, H, n, d), got "
                               f"{tuple(self.q.shape)}, {tuple(self.k.shape)}, {tuple(self.v.shape)}")
        if self.q.shape[0] < 1 or tuple(self.valid.shape) != tuple(self.q.shape[:1] + self.q.shape[2:3]):
            raise SpectraError(f"calibration of layer {self.layer}: valid has shape {tuple(self.valid.shape)}, "
                               f"expected (S, n) = {tuple(self.q.shape[:1] + self.q.shape[2:3])} with S ≥ 1")
        if self.q.dtype not in (torch.float32, torch.float64) or self.valid.dtype != torch.bool:
            raise SpectraError(f"calibration tensors must be float32/float64 with a bool valid, got {self.q.dtype}")
        with torch.inference_mode(False):  # captured under inference mode: copies autograd may save
            for name in ("q", "k", "v", "valid"):
                if getattr(self, name).is_inference():
                    setattr(self, name, getattr(self, name).clone())

    @classmethod
    def of(cls, records: Iterable[Captured]) -> Calibration:
        """One layer's captured records (batches) concatenated, padded to the longest, at least float32."""
        records = list(records)
        if not records:
            raise SpectraError("no captured record to calibrate on; run at least one batch")
        first = records[0]
        if any(r.layer != first.layer or r.scaling != first.scaling or r.causal != first.causal for r in records):
            raise SpectraError("the records of one calibration must come from one layer (same layer, scaling and "
                               "causality)")
        n = max(r.q.shape[-2] for r in records)
        dtype = torch.promote_types(first.q.dtype, torch.float32)

        def cat(parts: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat([torch.nn.functional.pad(x.to(dtype), (0, 0, 0, n - x.shape[-2])) for x in parts])

        valid = torch.cat([torch.nn.functional.pad(r.valid, (0, n - r.valid.shape[-1])) for r in records])
        return cls(first.layer, cat([r.q for r in records]), cat([r.k for r in records]),
                   cat([r.v for r in records]), valid, first.scaling, first.causal)

    @property
    def sequences(self) -> int:
        return self.q.shape[0]

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def n(self) -> int:
        return self.q.shape[-2]

    @property
    def nbytes(self) -> int:
        """Bytes this calibration holds once its target P V is formed (q, k, v, P V, valid)."""
        return 4 * self.q.numel() * self.q.element_size() + self.valid.numel()

    @cached_property
    def target(self) -> torch.Tensor:
        """P V (S, H, n, d), zero on padded query rows; P = softmax(q kᵀ s) over the keys each query may see (the
        valid ones, and for causal attention those at or before it), formed a few sequences at a time (P itself is
        S·H·n² numbers)."""
        parts = []
        for first in range(0, self.sequences, CHUNK):
            part = slice(first, first + CHUNK)
            valid = self.valid[part]
            p = masked_softmax(scores(self.q[part], self.k[part], self.scaling), allowed(valid, self.causal))
            out = p @ self.v[part].masked_fill(~valid[:, None, :, None], 0.0)
            parts.append(out.masked_fill(~valid[:, None, :, None], 0.0))
        return torch.cat(parts)

    def subset(self, index: torch.Tensor | slice) -> Calibration:
        """The calibration of some sequences, their target P V cut from this one's (formed here once, so the
        fits and the scale search, which take subsets at every step, never form P again)."""
        part = Calibration(self.layer, self.q[index], self.k[index], self.v[index], self.valid[index], self.scaling,
                           self.causal)
        part.__dict__["target"] = self.target[index]
        return part


def head_output_error(calib: Calibration, e: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """(S, H): ‖P V − softmax(Q (E K)ᵀ s)(F V)‖²_F / ‖P V‖²_F over each head's valid query rows.

    e, f: (H or 1, budget, ≥ n) or (budget, ≥ n), sliced to the first n columns; differentiable in e and f.
    """
    out, _ = eq7(calib.q, calib.k, calib.v, e, f, calib.valid, calib.scaling)
    target = calib.target
    error = (out - target).masked_fill(~calib.valid[:, None, :, None], 0.0).square().sum((-2, -1))
    return error / target.square().sum((-2, -1)).clamp_min(torch.finfo(target.dtype).tiny)


def pooling_matrix(budget: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """M (budget, n): row c averages the positions ⌊c·n/k⌋ … of window c, the windows of `methods.pooling`
    on n valid positions (equal when the budget divides n)."""
    check_budget(budget, n, "n")
    window = torch.div(torch.arange(n) * budget, n, rounding_mode="floor")
    member = torch.nn.functional.one_hot(window, budget).to(dtype).T  # (k, n)
    return member / member.sum(-1, keepdim=True)


def pooling_projections(layers: int, heads: int, budget: int, n: int, sharing: Sharing | str,
                        dtype: torch.dtype = torch.float32) -> Projections:
    """Every distinct E, F equal to the mean-pooling matrix M: eq. 7 is then `pool-mean` (equal windows)."""
    keys = distinct_keys(choose(Sharing, sharing, "sharing"), layers, heads)
    matrix = pooling_matrix(budget, n, dtype)
    return Projections(layers, heads, budget, n, sharing, weights={key: matrix for key in keys})


def by_layer(calibs: Sequence[Calibration], layers: int, heads: int, budget: int, n: int) -> dict[int, Calibration]:
    """The calibrations by layer, after checking they fit the projections asked for."""
    check_budget(budget, n, "n")
    if not calibs:
        raise SpectraError("the calibration set is empty; capture at least one layer of one sequence")
    found: dict[int, Calibration] = {}
    for calib in calibs:
        if not 0 <= calib.layer < layers or calib.layer in found:
            raise SpectraError(f"calibration of layer {calib.layer} is out of range 0…{layers - 1} or given twice")
        if calib.heads != heads or calib.n > n:
            raise SpectraError(f"calibration of layer {calib.layer} has {calib.heads} heads and {calib.n} tokens; "
                               f"the projections have {heads} heads and n = {n}")
        if calib.q.dtype != calibs[0].q.dtype:
            raise SpectraError("every calibration must have one dtype (all float32 or all float64)")
        found[calib.layer] = calib
    return dict(sorted(found.items()))
