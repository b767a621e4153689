"""Training-free approximations of a pretrained model's attention at a budget k_proj, and their errors.

Every method is one small function registered under a name: it takes one layer's captured tensors
(`Layer`) and a budget, and returns the approximated head outputs and, where the method has one, its
n×n effective context matrix P̃ (so ‖P − P̃‖ can be measured). Methods see padding through
`Layer.valid`: padded keys never contribute and padded query rows are ignored by the measures.

| method | P̃ | head output | cost per head |
| --- | --- | --- | --- |
| svd | P_k, the truncated SVD of P (Eckart–Young: the best rank-k matrix) | P_k V | O(n³), an oracle |
| jl | P Rᵀ R, R ∈ R^{k×n} seeded N(0, 1/k) (Theorem 1) | P̃ V | O(n² k) |
| linformer(s) | softmax(Q (E K)ᵀ/√d) F, E, F seeded N(0, 1/k) under sharing s (eq. 7) | P̃ V | O(n k d) |
| pool-mean | softmax(Q K̄ᵀ/√d + log|W|) M, K̄, V̄ = window means of K, V, M the mean-pooling matrix | P̃ V | O(n k d) |
| pool-max | — (max pooling is not linear) | softmax(Q K̄ᵀ/√d + log|W|) V̄ with window maxima | O(n k d) |

Pooling windows split the m valid positions into k contiguous windows of ⌊m/k⌋ or ⌈m/k⌉ tokens; the
log|W| term weighs a pooled key by its window size, so uneven windows are not biased and k = n is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import torch

from . import linformer
from .capture import Substitute
from .errors import SpectraError
from .capture import key_valid
from .spectrum import masked, split_threads
from .stats import ErrorStats
from .theory import derive_seed, jl_matrix, orthogonal_matrix

MEASURES = ("out_err", "p_err", "tv")
PROJECTIONS = ("gaussian", "orthogonal")
_TAG_JL = 401


@dataclass
class Layer:
    """One layer's captured attention in float32 or better: q, k, v (B, H, n, d), valid keys (B, n), and
    P with padded rows and columns zeroed (B, H, n, n) — formed only when a method or measure asks."""

    layer: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor
    scaling: float
    seed: int = 0
    projection: str = "gaussian"
    _p: torch.Tensor | None = field(default=None, repr=False)
    _svd: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)

    @classmethod
    def captured(cls, layer: int, q, k, v, mask, p, scaling: float, **options) -> "Layer":
        """From the capture attention's tensors (any dtype; promoted to float32 or better); p may be None
        (then it is computed from q and k on first use, so a substitution that never needs it skips it)."""
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        valid = key_valid(mask, q.shape[0], k.shape[-2], q.device)
        v = v * valid[:, None, :, None].to(dtype)
        given = None if p is None else masked(p.to(dtype), valid)
        return cls(layer, q, k, v, valid, scaling, _p=given, **options)

    @property
    def p(self) -> torch.Tensor:
        if self._p is None:
            scores = (self.q @ self.k.transpose(-1, -2)) * self.scaling
            p = torch.softmax(scores.masked_fill(~self.valid[:, None, None, :], float("-inf")), dim=-1)
            self._p = masked(p, self.valid)
        return self._p

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """U, σ, Vᵀ of P, computed once per layer for every budget."""
        if self._svd is None:
            parts = split_threads(lambda p: torch.linalg.svd(p, full_matrices=False), self.p)
            self._svd = tuple(torch.cat(factor).reshape(*self.p.shape[:-2], *factor[0].shape[1:])
                              for factor in zip(*parts))
        return self._svd

    def random(self, budget: int, which: int = 0) -> torch.Tensor:
        """A seeded projection R (H, k_proj, n) per head: Gaussian N(0, 1/k) or scaled orthonormal rows."""
        heads, n = self.q.shape[1], self.q.shape[-2]
        draw = jl_matrix if self.projection == "gaussian" else orthogonal_matrix
        return torch.stack([
            draw(budget, n, derive_seed(self.seed, _TAG_JL, budget, self.layer, head, which),
                 device=self.q.device, dtype=self.q.dtype)
            for head in range(heads)
        ])


@dataclass
class Approximation:
    out: torch.Tensor  # (B, H, n, d)
    p: torch.Tensor | None  # (B, H, n, n) or None


Method = Callable[[Layer, int], Approximation]
METHODS: dict[str, Method] = {}


def method(name: str) -> Callable[[Method], Method]:
    """Register a method under `name`: a function (layer, budget) → Approximation."""

    def register(fn: Method) -> Method:
        METHODS[name] = fn
        return fn

    return register


@method("svd")
def svd(x: Layer, budget: int) -> Approximation:
    u, sigma, vh = x.svd()
    p_k = (u[..., :budget] * sigma[..., None, :budget]) @ vh[..., :budget, :]
    return Approximation(p_k @ x.v, p_k)


@method("jl")
def jl(x: Layer, budget: int) -> Approximation:
    r = x.random(budget) * x.valid[:, None, None, :]  # (B, H, k, n): padded columns never mix in
    p_tilde = (x.p @ r.transpose(-1, -2)) @ r
    return Approximation(p_tilde @ x.v, p_tilde)


def _linformer(sharing: str) -> Method:
    def run(x: Layer, budget: int) -> Approximation:
        heads, n = x.q.shape[1], x.q.shape[-2]
        if x.projection == "gaussian":
            e, f = linformer.jl_pair(sharing, x.layer, heads, budget, n, x.seed)
        else:  # per-head orthogonal E; F = E under kv/layerwise sharing
            e = x.random(budget, which=1)
            f = e if sharing in ("kv", "layerwise") else x.random(budget, which=2)
        e, f = e.to(x.q), f.to(x.q)
        k_bar = linformer.compress(x.k, e, x.valid)
        p_bar = torch.softmax(torch.einsum("bhid,bhcd->bhic", x.q, k_bar) * x.scaling, dim=-1)
        p_tilde = p_bar @ (f[..., :n] * x.valid[:, None, None, :])  # (B, H, n, n)
        return Approximation(p_tilde @ x.v, p_tilde)

    return run


for _sharing in linformer.SHARING:
    METHODS[f"linformer({_sharing})"] = _linformer(_sharing)


def _windows(valid: torch.Tensor, budget: int) -> torch.Tensor:
    """Window id (B, n) of every position: ⌊rank·k/m⌋ over the m valid positions; padding goes to id k."""
    rank = valid.long().cumsum(-1) - 1
    m = valid.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(valid, torch.div(rank * budget, m, rounding_mode="floor"), budget)


def _pool(x: torch.Tensor, window: torch.Tensor, budget: int, reduce: str) -> torch.Tensor:
    """Reduce x (B, H, n, d) over windows → (B, H, k_proj, d) (the padding bucket dropped)."""
    index = window[:, None, :, None].expand_as(x)
    shape = (*x.shape[:2], budget + 1, x.shape[-1])
    return x.new_zeros(shape).scatter_reduce(-2, index, x, reduce=reduce, include_self=False)[..., :budget, :]


def _pooled(x: Layer, budget: int, reduce: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax weights over pooled keys (B, H, n, k), pooled values, and window ids."""
    window = _windows(x.valid, budget)
    sizes = x.q.new_zeros(window.shape[0], budget + 1).scatter_add(
        -1, window, torch.ones_like(window, dtype=x.q.dtype))[:, :budget]
    k_bar, v_bar = _pool(x.k, window, budget, reduce), _pool(x.v, window, budget, reduce)
    logits = torch.einsum("bhid,bhcd->bhic", x.q, k_bar) * x.scaling + sizes.log()[:, None, None, :]
    return torch.softmax(logits, dim=-1), v_bar, window


@method("pool-mean")
def pool_mean(x: Layer, budget: int) -> Approximation:
    p_bar, _, window = _pooled(x, budget, "mean")
    member = torch.nn.functional.one_hot(window, budget + 1)[..., :budget].to(x.q.dtype)  # (B, n, k)
    mean_pool = (member / member.sum(1, keepdim=True).clamp_min(1)).transpose(-1, -2)  # (B, k, n)
    p_tilde = p_bar @ mean_pool[:, None]
    return Approximation(p_tilde @ x.v, p_tilde)


@method("pool-max")
def pool_max(x: Layer, budget: int) -> Approximation:
    p_bar, v_bar, _ = _pooled(x, budget, "amax")
    return Approximation(p_bar @ v_bar, None)


def expand_methods(names: list[str]) -> list[str]:
    """Method labels from user names: `linformer` means all four sharing levels."""
    labels: list[str] = []
    for name in names:
        name = name.strip()
        found = [label for label in METHODS if label == name or label.startswith(f"{name}(")]
        if not found:
            valid = sorted({label.split("(")[0] for label in METHODS} | set(METHODS))
            raise SpectraError(f"unknown method '{name}'; valid methods: {', '.join(valid)}")
        labels += [label for label in found if label not in labels]
    if not labels:
        raise SpectraError("no method given; pass e.g. --methods svd,jl,linformer,pool-mean")
    return labels


def check_budgets(budgets: list[int], n: int) -> list[int]:
    if not budgets:
        raise SpectraError("the list of budgets is empty; pass e.g. --k 32,64,128")
    for budget in budgets:
        if budget < 1:
            raise SpectraError(f"k = {budget} is not a budget: use k ≥ 1")
        if budget > n:
            raise SpectraError(f"k = {budget} exceeds the sequence length n = {n}; use k ≤ n")
    return sorted(set(budgets))


def measures(x: Layer, approx: Approximation) -> torch.Tensor:
    """MEASURES (3, B, H) of one approximation; NaN where the method has no P̃.

    out_err = ‖P V − Ṽ‖_F/‖P V‖_F over valid rows; p_err = ‖P − P̃‖_F/‖P‖_F; tv = mean over valid rows
    of the total-variation distance between P's row and P̃'s row made a distribution (negative
    entries clipped to 0, then renormalised; a row with no positive mass counts as distance 1).
    """
    rows = x.valid[:, None, :, None].to(x.v.dtype)
    exact = (x.p @ x.v) * rows
    tiny = torch.finfo(exact.dtype).tiny
    out_err = ((approx.out * rows - exact).flatten(-2).norm(dim=-1)
               / exact.flatten(-2).norm(dim=-1).clamp_min(tiny))
    if approx.p is None:
        nan = torch.full_like(out_err, math.nan)
        return torch.stack([out_err, nan, nan])
    p, p_tilde = x.p, masked(approx.p, x.valid)
    p_err = (p - p_tilde).flatten(-2).norm(dim=-1) / p.flatten(-2).norm(dim=-1).clamp_min(tiny)
    positive = p_tilde.clamp_min(0)
    mass = positive.sum(-1, keepdim=True)
    row_tv = torch.where(mass[..., 0] > 0, 0.5 * (p - positive / mass.clamp_min(tiny)).abs().sum(-1), 1.0)
    valid_rows = x.valid[:, None, :].to(row_tv.dtype)
    tv = (row_tv * valid_rows).sum(-1) / valid_rows.sum(-1).clamp_min(1)
    return torch.stack([out_err, p_err, tv])


class HeadProbe:
    """Streams every layer's captured attention through each (method, budget) and keeps error statistics.

    Cells are (method, budget, layer, head, measure); samples are sequences.
    """

    def __init__(self, labels: list[str], budgets: list[int], layers: int, heads: int, *, seed: int = 0,
                 projection: str = "gaussian", target: float = 0.1) -> None:
        if projection not in PROJECTIONS:
            raise SpectraError(f"unknown projection '{projection}'; use one of {', '.join(PROJECTIONS)}")
        self.labels, self.budgets, self.seed, self.projection = labels, budgets, seed, projection
        self.stats = ErrorStats((len(labels), len(budgets), layers, heads, len(MEASURES)), eps=(target,))

    def update(self, layer: int, q, k, v, mask, p, *, scaling: float) -> None:
        x = Layer.captured(layer, q, k, v, mask, p, scaling, seed=self.seed, projection=self.projection)
        for i, label in enumerate(self.labels):
            for j, budget in enumerate(self.budgets):
                errors = measures(x, METHODS[label](x, budget)).permute(2, 0, 1)  # (H, measure, B)
                self.stats.add((i, j, layer), errors, keep=~errors.isnan())

    def state(self) -> dict[str, np.ndarray]:
        return self.stats.state("heads")

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "heads")

    def table(self) -> pd.DataFrame:
        """One row per (method, budget, layer, head, metric) with samples, mean, median, p95, max and
        pr_below_target, the fraction of sequences whose error is at most the target."""
        _, _, layers, heads, _ = self.stats.cells
        frame = self.stats.frame({"method": self.labels, "budget": self.budgets, "layer": list(range(layers)),
                                  "head": list(range(heads)), "metric": list(MEASURES)})
        frame = frame[frame["samples"] > 0].rename(columns={"eps": "target", "pr": "pr_below_target"})
        return frame.reset_index(drop=True)


def substitute(label: str, budget: int, layers: set[int] | None, *, seed: int = 0,
               projection: str = "gaussian") -> Substitute:
    """A capture substitution computing `label` at `budget` in `layers` (all when None)."""
    approximate = METHODS[label]

    def run(layer: int, q, k, v, mask, scaling: float) -> torch.Tensor | None:
        if layers is not None and layer not in layers:
            return None
        x = Layer.captured(layer, q, k, v, mask, None, scaling, seed=seed, projection=projection)
        return approximate(x, budget).out.to(q.dtype)

    return run


from . import families  # noqa: E402,F401  (registers the other efficient-attention families)
