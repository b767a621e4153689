"""`spectra theorems`'s probes: Theorems 1 and 2 checked on each captured layer, errors streamed per cell.

Each probe streams errors into `ErrorStats` (exact counts for Pr(error ≤ ε), a fixed log10 histogram for
quantiles), so memory does not grow with the number of sequences and results do not depend on batching.
Its tables are pooled over layers and heads (`theorem<i>.csv`), per layer (`*_layers.csv`) and per head
(`*_heads.csv`), one row per (…, budget, method[, variant, relative_to], eps). Theorem 1's bound uses the
probe's n (its longest sequence), also for shorter, padded sequences.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..config import Sharing, check_budgets, check_eps, choose
from ..errors import SpectraError
from ..kernels import eq7, masked_softmax, scores
from ..nn.projections import jl_pair
from ..seeds import Domain, jl_matrix
from ..spectrum import masked
from ..stats import ErrorStats, Reduce, State, tagged
from ..theory.bounds import (
    DELTA_RULES,
    check_deltas,
    delta_value,
    theorem1_bound,
    theorem1_k,
    theorem2_k,
)
from ..theory.errors import as_float, best_rank_errors, theorem1_errors, theorem2_errors
from .base import Probe
from .draws import Uncertainty, draw_seed


class DrawnMatrices:
    """The fixed draws (Theorem 1's R, Theorem 2's Linformer E, F) reused across batches, kept while their total
    stays under max_bytes (then drawn again)."""

    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self.items: dict[tuple, torch.Tensor] = {}
        self.bytes, self.max_bytes = 0, max_bytes

    def get(self, key: tuple, make) -> torch.Tensor:
        if key in self.items:
            return self.items[key]
        value = make()
        size = sum(t.numel() * t.element_size() for t in (value if isinstance(value, tuple) else (value,)))
        if self.bytes + size <= self.max_bytes:
            self.items[key] = value
            self.bytes += size
        return value


class DrawingProbe(Probe):
    """What the two theorem probes share: their cells' error statistics and the seeded R they draw (once, or
    per sequence and draw) under their seed domain."""

    domain: Domain

    def _start(self, layers: int, heads: int, n: int, budgets: Sequence[int], eps: Sequence[float], seed: int,
               draws: int, fixed: bool) -> None:
        self.layers, self.heads, self.n, self.seed = layers, heads, n, seed
        self.budgets = check_budgets(budgets, n)
        self.eps = check_eps(eps)
        self.draws, self.fixed = (1, True) if fixed else (_check_draws(draws), False)
        self._drawn = DrawnMatrices()

    def _cells(self, per_decade: int) -> None:
        """Error statistics and draw uncertainty of every (layer, head, budget, variant) once variants are set."""
        cells = (self.layers, self.heads, len(self.budgets), len(self.variants))
        self.stats = ErrorStats(cells, self.eps, per_decade=per_decade)
        self.uncertainty = Uncertainty(self.layers, self.heads, cells[2:], self.eps, self.draws)

    def r(self, layer: int, budget: int, device: torch.device | str = "cpu", sequence: int | None = None,
          draw: int = 0) -> torch.Tensor:
        """R (budget, n) of a layer: the fixed one, or one sequence's `draw` (the same numbers on every device)."""
        seed = draw_seed(self.seed, self.domain, layer, budget, None if self.fixed else sequence, draw)
        make = lambda: jl_matrix(budget, self.n, seed, device=device)  # noqa: E731
        return self._drawn.get(("r", layer, budget, str(device)), make) if self.fixed else make()


class Theorem1Probe(DrawingProbe):
    """Theorem 1 on captured P: per (layer, head, budget), relative errors ‖P̃ w − P w‖/‖P w‖ of every column w of V.

    methods: "jl" — P̃ = P Rᵀ R with R (budget × n) JL, shared by the heads of a layer, drawn `draws` times per
    sequence (seeded by its global index; `fixed`: one R per (seed, layer, budget)); "svd" — the best rank-k
    approximation (see theory.errors: a floor in matrix norm, not strictly per column; it draws nothing).
    relative_to: "output" — the statement's ‖P w‖; "rows" (jl only) — the form the proof bounds, each entry
    against ε ‖P_i‖ ‖w‖. Padded sequences use only their valid m × m block of P and m rows of V (R's first m
    columns).
    """

    domain = Domain.THEOREM1

    def __init__(
        self, layers: int, heads: int, n: int, budgets: Sequence[int], eps: Sequence[float], *, seed: int = 0,
        best_rank: bool = True, draws: int = 1, fixed: bool = False, per_decade: int = 100,
    ) -> None:
        self._start(layers, heads, n, budgets, eps, seed, draws, fixed)
        self.variants = [("jl", "output"), ("jl", "rows")] + ([("svd", "output")] if best_rank else [])
        self._cells(per_decade)

    def _jl(self, p: torch.Tensor, v: torch.Tensor, layer: int, budget: int, index: list[int], draw: int,
            rows: bool) -> torch.Tensor:
        """(B, H, d) errors of one draw: one R for the batch when fixed, else each sequence's own."""
        if self.fixed:
            return theorem1_errors(p, v, self.r(layer, budget, p.device), rows=rows)
        return torch.cat([theorem1_errors(p[b:b + 1], v[b:b + 1], self.r(layer, budget, p.device, sequence, draw),
                                          rows=rows) for b, sequence in enumerate(index)])

    def update(self, captured: Captured) -> None:
        layer, valid = captured.layer, captured.valid
        batch, heads, width, d = captured.v.shape
        _check_shape(self, layer, heads, width)
        p = masked(as_float(captured.p), valid)
        v = as_float(captured.v) * valid[:, None, :, None]
        index = captured.sequence_index()
        per_variant = []  # each (K, D, B, H, d)
        for method, relative_to in self.variants:
            if method == "jl":
                per_variant.append(torch.stack([torch.stack([self._jl(p, v, layer, budget, index, draw, relative_to == "rows")
                                                             for draw in range(self.draws)])
                                                for budget in self.budgets]))
            else:  # the truncated SVD draws nothing: the same errors stand for every draw
                per_variant.append(best_rank_errors(p, v, self.budgets)[:, None].expand(-1, self.draws, -1, -1, -1))
        stacked = torch.stack(per_variant, dim=1).permute(4, 0, 1, 2, 3, 5)  # (H, K, V, D, B, d)
        self.stats.add(layer, stacked.reshape(heads, len(self.budgets), len(self.variants), -1))
        self.uncertainty.add(layer, index, stacked, torch.ones(batch, d))

    def after_batch(self, batch) -> None:
        self.uncertainty.flush()

    def result(self, pool: Sequence[str] = ()) -> pd.DataFrame:
        """Rows (layer, head, budget, method, relative_to, eps): samples, pr = Pr(error ≤ ε) over every sample,
        median, p95, mean, max; sequences, pr_mean (each sequence's rate, averaged), its 95% interval pr_low,
        pr_high over sequences, pr_draw_std (the spread across draws); n, draws, bound = Theorem 1's
        max(0, 1 − 2n e^{−(ε²−ε³)k/4}), k_theory = 5 ln n/(ε² − ε³). `pool` names axes ("layer", "head")
        whose cells are pooled into one (and dropped from the table). svd rows count each sample once."""
        table = _pooled_frame(
            self.stats, {"layer": range(self.layers), "head": range(self.heads), "budget": self.budgets,
                         "variant": range(len(self.variants))}, pool)
        chosen = [self.variants[i] for i in table.pop("variant")]
        position = list(table.columns).index("budget") + 1
        table.insert(position, "method", [m for m, _ in chosen])
        table.insert(position + 1, "relative_to", [r for _, r in chosen])
        table.loc[table["method"] == "svd", "samples"] //= self.draws
        table = table.assign(**self.uncertainty.columns(pool))
        table["n"] = self.n
        table["draws"] = 0 if self.fixed else self.draws
        table["bound"] = [theorem1_bound(e, self.n, budget) for e, budget in zip(table["eps"], table["budget"])]
        table["k_theory"] = table["eps"].map(lambda e: theorem1_k(e, self.n))
        return table

    def state(self) -> State:
        return {**self.stats.state("theorem1"), **self.uncertainty.state("theorem1.clusters")}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "theorem1")
        self.uncertainty.load_state(arrays, "theorem1.clusters")

    def tables(self) -> dict[str, pd.DataFrame]:
        return _tables("theorem1", self.result)


class Theorem2Probe(DrawingProbe):
    """Theorem 2 on captured Q, K, V: per row w of A = Q Kᵀ·scaling, errors against softmax(w) V of

    - method "theorem2", variant "delta=<rule>": softmax(w Eᵀ) F V with E = δR, F = e^{−δ}R (R JL, shared by the
      heads of a layer), relative_to "rhs" (‖softmax(w)‖₂ ‖V‖_F, the theorem's right-hand side: the form its
      proof bounds) and "output" (‖softmax(w) V‖);
    - method "linformer", variant <sharing>: eq. 7 with JL E, F (`nn.projections.jl_pair`, the matrices
      `Projections(init="jl", max_len=n)` holds), relative_to "output".

    R, E and F are drawn `draws` times per sequence, seeded by its global index (`fixed`: once per (seed, layer,
    budget) — E, F from the run's seed). The score scale is the captured layer's (the model's own). Padded
    keys are dropped from w and V; padded query rows are not counted.
    """

    domain = Domain.THEOREM2

    def __init__(
        self, layers: int, heads: int, n: int, budgets: Sequence[int], eps: Sequence[float], *, seed: int = 0,
        deltas: Sequence[str | float] = DELTA_RULES, sharing: Sequence[Sharing | str] | None = None,
        draws: int = 1, fixed: bool = False, per_decade: int = 100,
    ) -> None:
        self._start(layers, heads, n, budgets, eps, seed, draws, fixed)
        self.deltas = check_deltas(deltas)
        self.sharing = tuple(choose(Sharing, level, "sharing") for level in (Sharing if sharing is None else sharing))
        if not self.deltas and not self.sharing:
            raise SpectraError("nothing to measure: pass at least one delta or one sharing level")
        self.variants = [("theorem2", f"delta={rule}", rel) for rule in self.deltas for rel in ("rhs", "output")]
        self.variants += [("linformer", level.value, "output") for level in self.sharing]
        self.d: int | None = None
        self._cells(per_decade)

    def ef(self, level: Sharing, layer: int, budget: int, device, sequence: int | None = None, draw: int = 0):
        """E, F (H, budget, n) of one sharing level: the run's, or one sequence's `draw`."""
        seed = self.seed if self.fixed else draw_seed(self.seed, Domain.LINFORMER, layer, budget, sequence, draw)
        make = lambda: tuple(t.to(device) for t in jl_pair(level, layer, self.heads, budget, self.n, seed))  # noqa
        return self._drawn.get(("ef", level, layer, budget, str(device)), make) if self.fixed else make()

    def _errors(self, batch: SimpleNamespace, layer: int, budget: int, draw: int) -> torch.Tensor:
        """(V, B, H, n) errors of every variant for one draw, on one captured batch (its q, k, v, valid keys,
        scores a, exact output and its norm, valid lengths, sequence indices and score scale)."""
        a, q, k, v, valid, exact, out_norm = (batch.a, batch.q, batch.k, batch.v, batch.valid, batch.exact,
                                              batch.out_norm)
        lengths, index, scaling = batch.lengths, batch.index, batch.scaling
        parts = [slice(None)] if self.fixed else [slice(b, b + 1) for b in range(len(index))]
        rows = []
        for part in parts:
            sequence = None if self.fixed else index[part.start]
            row = []
            if self.deltas:
                deltas = [torch.tensor([delta_value(rule, m) for m in lengths[part]], dtype=torch.float64)
                          for rule in self.deltas]
                rhs, out = theorem2_errors(a[part], v[part], self.r(layer, budget, q.device, sequence, draw), deltas,
                                           valid[part])
                row.extend(error for pair in zip(rhs, out) for error in pair)
            for level in self.sharing:
                e, f = self.ef(level, layer, budget, q.device, sequence, draw)
                approx, _ = eq7(q[part], k[part], v[part], e, f, valid[part], scaling)
                row.append((approx - exact[part]).norm(dim=-1) / out_norm[part])
            rows.append(torch.stack(row))
        return torch.cat(rows, dim=1)

    def update(self, captured: Captured) -> None:
        layer, valid, scaling = captured.layer, captured.valid, captured.scaling
        batch, heads, width, d = captured.q.shape
        _check_shape(self, layer, heads, width)
        self.d = d
        q, k, v = as_float(captured.q), as_float(captured.k), as_float(captured.v)
        a = scores(q, k, scaling)
        lengths = valid.sum(-1).tolist()
        exact = masked_softmax(a, valid[:, None, None, :]) @ (v * valid[:, None, :, None])
        out_norm = exact.norm(dim=-1).clamp_min(torch.finfo(exact.dtype).tiny)
        batch_ = SimpleNamespace(a=a, q=q, k=k, v=v, valid=valid, exact=exact, out_norm=out_norm, lengths=lengths,
                                 index=captured.sequence_index(), scaling=scaling)
        errors = torch.stack([torch.stack([self._errors(batch_, layer, budget, draw) for draw in range(self.draws)])
                              for budget in self.budgets])  # (K, D, V, B, H, n)
        stacked = errors.permute(4, 0, 2, 1, 3, 5)  # (H, K, V, D, B, n)
        self.stats.add(layer, stacked.reshape(heads, len(self.budgets), len(self.variants), -1),
                       valid[None].expand(self.draws, -1, -1).reshape(-1))
        self.uncertainty.add(layer, batch_.index, stacked, valid)

    def after_batch(self, batch) -> None:
        self.uncertainty.flush()

    def result(self, pool: Sequence[str] = ()) -> pd.DataFrame:
        """Rows (layer, head, budget, method, variant, relative_to, eps): samples, pr = Pr(error ≤ ε), median,
        p95, mean, max; sequences, pr_mean, pr_low, pr_high, pr_draw_std (see Theorem1Probe.result); n, d,
        draws, delta (δ at n, NaN for linformer rows), k_theory = min{9 d ln d, 5 ln n}/ε². `pool` names axes
        ("layer", "head") whose cells are pooled into one (and dropped from the table)."""
        table = _pooled_frame(self.stats, {
            "layer": range(self.layers), "head": range(self.heads), "budget": self.budgets,
            "variant": range(len(self.variants)),
        }, pool)
        chosen = [self.variants[i] for i in table.pop("variant")]
        position = list(table.columns).index("budget") + 1
        table.insert(position, "method", [m for m, _, _ in chosen])
        table.insert(position + 1, "variant", [v for _, v, _ in chosen])
        table.insert(position + 2, "relative_to", [r for _, _, r in chosen])
        table = table.assign(**self.uncertainty.columns(pool))
        rules = {f"delta={rule}": delta_value(rule, self.n) for rule in self.deltas}
        table["n"] = self.n
        table["d"] = self.d if self.d is not None else np.nan
        table["draws"] = 0 if self.fixed else self.draws
        table["delta"] = table["variant"].map(lambda v: rules.get(v, np.nan)).astype(float)
        table["k_theory"] = [theorem2_k(e, self.n, self.d) if self.d else np.nan for e in table["eps"]]
        return table

    def state(self) -> State:
        return {**self.stats.state("theorem2"), **self.uncertainty.state("theorem2.clusters"),
                **tagged({"theorem2.d": np.array(self.d or 0)}, Reduce.MAX)}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "theorem2")
        self.uncertainty.load_state(arrays, "theorem2.clusters")
        self.d = int(arrays.get("theorem2.d", 0)) or None

    def tables(self) -> dict[str, pd.DataFrame]:
        return _tables("theorem2", self.result)


def _check_draws(draws: int) -> int:
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise SpectraError(f"--draws must be a positive integer, got {draws!r}")
    return draws


def _tables(name: str, result) -> dict[str, pd.DataFrame]:
    """A theorem's tables pooled over layers and heads, per layer and per head."""
    return {f"{name}.csv": result(pool=("layer", "head")), f"{name}_layers.csv": result(pool=("head",)),
            f"{name}_heads.csv": result()}


def _pooled_frame(stats: ErrorStats, axes: dict[str, Sequence], pool: Sequence[str]) -> pd.DataFrame:
    """stats.frame with the named axes pooled."""
    unknown = set(pool) - set(axes)
    if unknown:
        raise ValueError(f"cannot pool {sorted(unknown)}: the axes are {list(axes)}")
    pooled = stats.pooled(tuple(i for i, name in enumerate(axes) if name in pool)) if pool else stats
    return pooled.frame({name: labels for name, labels in axes.items() if name not in pool})


def _check_shape(probe: Theorem1Probe | Theorem2Probe, layer: int, heads: int, width: int) -> None:
    if not 0 <= layer < probe.layers or heads != probe.heads or width > probe.n:
        raise SpectraError(
            f"the probe expects layers 0…{probe.layers - 1}, {probe.heads} heads and sequences of ≤ {probe.n} tokens; "
            f"got layer {layer}, {heads} heads, {width} tokens — build it with the model's shape and the run's length"
        )
