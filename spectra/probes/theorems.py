"""`spectra theorems`'s probes: Theorems 1 and 2 checked on each captured layer, errors streamed per cell.

Each probe streams errors into `ErrorStats` (exact counts for Pr(error ≤ ε), a fixed log10 histogram for
quantiles), so memory does not grow with the number of sequences and results do not depend on batching.
Its tables are pooled over layers and heads (`theorem<i>.csv`), per layer (`*_layers.csv`) and per head
(`*_heads.csv`), one row per (…, k_proj, method[, variant, relative_to], eps). Theorem 1's bound uses the
probe's n (its longest sequence), also for shorter, padded sequences.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..config import Sharing, check_budgets, check_eps, choose
from ..errors import SpectraError
from ..nn.linformer import linear_attention
from ..nn.projections import jl_pair
from ..seeds import Domain, derive_seed, jl_matrix
from ..spectrum import masked
from ..stats import ErrorStats, State, tagged, Reduce
from ..theory.bounds import DELTA_RULES, check_deltas, delta_value, theorem1_bound, theorem1_k, theorem2_k
from ..theory.kernels import as_float, best_rank_errors, theorem1_errors, theorem2_errors
from .base import Probe


class Cache:
    """Matrices reused across batches, kept while their total stays under max_bytes (then recomputed)."""

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


class Theorem1Probe(Probe):
    """Theorem 1 on captured P: per (layer, head, k_proj), relative errors ‖P̃ w − P w‖/‖P w‖ of every column w of V.

    methods: "jl" — P̃ = P Rᵀ R with R (k_proj × n) JL, drawn per (seed, layer, k_proj) and shared by the
    heads of a layer (so results do not depend on batching); "svd" — the best rank-k_proj approximation
    (see the module docstring: a floor in matrix norm, not strictly per column). Padded sequences use only
    their valid m × m block of P and m rows of V (R's first m columns).
    """

    def __init__(
        self, layers: int, heads: int, n: int, k_projs: Sequence[int], eps: Sequence[float], *, seed: int = 0,
        best_rank: bool = True, per_decade: int = 100,
    ) -> None:
        self.layers, self.heads, self.n, self.seed = layers, heads, n, seed
        self.k_projs = check_budgets(k_projs, n)
        self.eps = check_eps(eps)
        self.methods = ("jl", "svd") if best_rank else ("jl",)
        self.stats = ErrorStats((layers, heads, len(self.k_projs), len(self.methods)), self.eps, per_decade=per_decade)
        self._cache = Cache()

    def r(self, layer: int, k_proj: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The layer's R (k_proj, n) for this probe's seed (the same numbers on every device)."""
        seed = derive_seed(self.seed, Domain.THEOREM1, layer, k_proj)
        return self._cache.get(("r", layer, k_proj, str(device)), lambda: jl_matrix(k_proj, self.n, seed, device=device))

    def update(self, captured: Captured) -> None:
        layer, valid = captured.layer, captured.valid
        _, heads, width, _ = captured.v.shape
        _check_shape(self, layer, heads, width)
        p = masked(as_float(captured.p), valid)
        v = as_float(captured.v) * valid[:, None, :, None]
        errors = [torch.stack([theorem1_errors(p, v, self.r(layer, k_proj, p.device)) for k_proj in self.k_projs])]
        if "svd" in self.methods:
            errors.append(best_rank_errors(p, v, self.k_projs))
        stacked = torch.stack(errors, dim=1)  # (K, M, B, H, d)
        self.stats.add(layer, stacked.permute(3, 0, 1, 2, 4).reshape(heads, len(self.k_projs), len(self.methods), -1))

    def result(self, pool: Sequence[str] = ()) -> pd.DataFrame:
        """Rows (layer, head, k_proj, method, eps): samples, pr = Pr(error ≤ ε), median, p95, mean, max,
        n, bound = Theorem 1's max(0, 1 − 2n e^{−(ε²−ε³)k/4}), k_theory = 5 ln n/(ε² − ε³).
        `pool` names axes ("layer", "head") whose cells are pooled into one (and dropped from the table)."""
        table = _pooled_frame(
            self.stats, {"layer": range(self.layers), "head": range(self.heads), "k_proj": self.k_projs,
                         "method": self.methods}, pool)
        table["n"] = self.n
        table["bound"] = [theorem1_bound(e, self.n, k) for e, k in zip(table["eps"], table["k_proj"])]
        table["k_theory"] = table["eps"].map(lambda e: theorem1_k(e, self.n))
        return table

    def state(self) -> State:
        return self.stats.state("theorem1")

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "theorem1")

    def tables(self) -> dict[str, pd.DataFrame]:
        return _tables("theorem1", self.result)


class Theorem2Probe(Probe):
    """Theorem 2 on captured Q, K, V: per row w of A = Q Kᵀ·scaling, errors against softmax(w) V of

    - method "theorem2", variant "delta=<rule>": softmax(w Eᵀ) F V with E = δR, F = e^{−δ}R (R JL,
      per (seed, layer, k_proj), shared by heads), relative_to "rhs" (‖softmax(w)‖₂ ‖V‖_F, the
      theorem's right-hand side) and "output" (‖softmax(w) V‖);
    - method "linformer", variant <sharing>: eq. 7 with JL E, F (`linformer.jl_pair`, the matrices
      `Projections(init="jl", seed=seed, max_len=n)` holds), relative_to "output".

    The score scale is the captured layer's (the model's own). Padded keys are dropped from w and V;
    padded query rows are not counted.
    """

    def __init__(
        self, layers: int, heads: int, n: int, k_projs: Sequence[int], eps: Sequence[float], *, seed: int = 0,
        deltas: Sequence[str | float] = DELTA_RULES, sharing: Sequence[Sharing | str] | None = None,
        per_decade: int = 100,
    ) -> None:
        self.layers, self.heads, self.n, self.seed = layers, heads, n, seed
        self.k_projs = check_budgets(k_projs, n)
        self.eps = check_eps(eps)
        self.deltas = check_deltas(deltas)
        self.sharing = tuple(choose(Sharing, level, "sharing") for level in (Sharing if sharing is None else sharing))
        if not self.deltas and not self.sharing:
            raise SpectraError("nothing to measure: pass at least one delta or one sharing level")
        self.variants = [("theorem2", f"delta={rule}", rel) for rule in self.deltas for rel in ("rhs", "output")]
        self.variants += [("linformer", level.value, "output") for level in self.sharing]
        self.d: int | None = None
        self.stats = ErrorStats((layers, heads, len(self.k_projs), len(self.variants)), self.eps, per_decade=per_decade)
        self._cache = Cache()

    def r(self, layer: int, k_proj: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The layer's R (k_proj, n) of the δ variants, for this probe's seed."""
        seed = derive_seed(self.seed, Domain.THEOREM2, layer, k_proj)
        return self._cache.get(("r", layer, k_proj, str(device)), lambda: jl_matrix(k_proj, self.n, seed, device=device))

    def update(self, captured: Captured) -> None:
        layer, valid, scaling = captured.layer, captured.valid, captured.scaling
        _, heads, width, d = captured.q.shape
        _check_shape(self, layer, heads, width)
        self.d = d
        q, k, v = as_float(captured.q), as_float(captured.k), as_float(captured.v)
        a = torch.einsum("bhid,bhjd->bhij", q, k) * scaling
        lengths = valid.sum(-1).tolist()
        exact = torch.softmax(a.masked_fill(~valid[:, None, None, :], float("-inf")), dim=-1) @ (v * valid[:, None, :, None])
        out_norm = exact.norm(dim=-1).clamp_min(torch.finfo(exact.dtype).tiny)
        errors = []
        deltas = [torch.tensor([delta_value(rule, m) for m in lengths], dtype=torch.float64) for rule in self.deltas]
        for k_proj in self.k_projs:
            row = []
            if deltas:
                rhs, out = theorem2_errors(a, v, self.r(layer, k_proj, q.device), deltas, valid)
                row.extend(error for pair in zip(rhs, out) for error in pair)
            for level in self.sharing:
                e, f = self._cache.get(
                    ("ef", level, layer, k_proj, str(q.device)),
                    lambda: tuple(t.to(q.device) for t in jl_pair(level, layer, heads, k_proj, self.n, self.seed)),
                )
                approx = linear_attention(q, k, v, e, f, valid, scaling)
                row.append((approx - exact).norm(dim=-1) / out_norm)
            errors.append(torch.stack(row))  # (M, B, H, n)
        stacked = torch.stack(errors).permute(3, 0, 1, 2, 4).reshape(heads, len(self.k_projs), len(self.variants), -1)
        self.stats.add(layer, stacked, valid.reshape(-1))

    def result(self, pool: Sequence[str] = ()) -> pd.DataFrame:
        """Rows (layer, head, k_proj, method, variant, relative_to, eps): samples, pr = Pr(error ≤ ε), median,
        p95, mean, max, n, d, delta (δ at n, NaN for linformer rows), k_theory = min{9 d ln d, 5 ln n}/ε².
        `pool` names axes ("layer", "head") whose cells are pooled into one (and dropped from the table)."""
        table = _pooled_frame(self.stats, {
            "layer": range(self.layers), "head": range(self.heads), "k_proj": self.k_projs,
            "variant": range(len(self.variants)),
        }, pool)
        chosen = [self.variants[i] for i in table.pop("variant")]
        at = list(table.columns).index("k_proj") + 1
        table.insert(at, "method", [m for m, _, _ in chosen])
        table.insert(at + 1, "variant", [v for _, v, _ in chosen])
        table.insert(at + 2, "relative_to", [r for _, _, r in chosen])
        rules = {f"delta={rule}": delta_value(rule, self.n) for rule in self.deltas}
        table["n"] = self.n
        table["d"] = self.d if self.d is not None else np.nan
        table["delta"] = table["variant"].map(lambda v: rules.get(v, np.nan)).astype(float)
        table["k_theory"] = [theorem2_k(e, self.n, self.d) if self.d else np.nan for e in table["eps"]]
        return table

    def state(self) -> State:
        return {**self.stats.state("theorem2"), **tagged({"theorem2.d": np.array(self.d or 0)}, Reduce.MAX)}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "theorem2")
        self.d = int(arrays.get("theorem2.d", 0)) or None

    def tables(self) -> dict[str, pd.DataFrame]:
        return _tables("theorem2", self.result)


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
