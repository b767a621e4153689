"""The Linformer paper's theory, checked on real attention: JL matrices, bounds, Theorem 1 and 2 probes.

Conventions (documented choices):
- log is the NATURAL log in every formula (k(ε, n) = 5 ln n / (ε² − ε³); n = 512, ε = 0.5 gives ≈ 249.5).
- JL matrices R ∈ R^{k_proj × n} have i.i.d. N(0, 1/k_proj) entries, drawn with numpy's PCG64 from a seed
  derived from (seed, what, layer, k_proj, …); they are drawn column by column, so the first m columns of
  an n-column draw equal the m-column draw (the slicing rule costs nothing), on any device.
- Theorem 2's k = min{9 d ln d / ε², 5 ln n / ε²} takes the Θ(·) constants as 1; the paper gives none.
- Theorem 2's right-hand side ‖softmax(w)‖ ‖V‖ uses the Euclidean norm of the probability row and the
  FROBENIUS norm of V: a column-by-column JL argument (the proof's tool) bounds the error by
  ε‖softmax(w)‖ ‖V‖_F. The spectral norm is ≤ the Frobenius norm, so errors relative to it would be larger.
- Theorem 2's δ may be a constant or a rule of the sequence length: "1/2^n" (appendix B) and "1/n"
  (its θ(1/n)), evaluated per sequence at its valid length. 2^-n underflows to 0.0 in float64 for
  n ≥ 1075 (and in float32 for n ≥ 150, where the probe computes); any δ below ~1e-8 makes
  softmax(w δRᵀ) exactly uniform in floating point, so the probe then measures the δ → 0 limit
  (uniform weights, F = R) — exactly what the paper's choice means numerically. The `delta` column
  reports δ at the probe's n in float64 (0.0 when it underflows).
- Theorem 1's error of the best rank-k_proj approximation P_k (truncated SVD) is the reference floor:
  Eckart–Young makes ‖P − P_k‖ minimal over all rank-k_proj matrices in Frobenius and spectral norm.
  The errors measured here are on columns w of V, which that does not floor strictly: for a given w
  (or even summed over V's columns) another rank-k_proj matrix, P Rᵀ R included, can do better.
- Theorem 1's bound uses the probe's n (its longest sequence), also for shorter, padded sequences.

Probes follow `capture.Probe`: update(layer, q, k, v, mask, p) per layer and batch; result() returns a
tidy DataFrame with one row per (layer, head, k_proj, method[, variant, relative_to], eps). Errors are
streamed into `ErrorStats` (exact counts for Pr(error ≤ ε), a fixed log10 histogram for quantiles), so
memory does not grow with the number of sequences and the results do not depend on batching.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from .capture import Probe, key_valid
from .errors import SpectraError
from .spectrum import masked
from .stats import ErrorStats, check_eps

DELTA_RULES = ("1/2^n", "1/n")
_TAG_T1, _TAG_T2 = 201, 202  # seed domains of the probes' R (linformer.py uses others)


# ---- seeds and matrices -------------------------------------------------------------------------


def derive_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed determined by (seed, *parts), independent across different parts."""
    if any(part < 0 for part in (seed, *parts)):
        raise SpectraError(f"seeds must be non-negative integers, got {seed} with parts {parts}")
    return int(np.random.SeedSequence([seed, *parts]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def jl_matrix(
    k_proj: int, n: int, seed: int = 0, *, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """R (k_proj, n) with i.i.d. N(0, 1/k_proj) entries; jl_matrix(k, n)[:, :m] == jl_matrix(k, m)."""
    _check_k(k_proj)
    if n < 1:
        raise SpectraError(f"n must be ≥ 1, got {n}")
    columns = np.random.default_rng(seed).standard_normal((n, k_proj))  # column j of R is row j
    return torch.from_numpy(columns.T / math.sqrt(k_proj)).to(device=device, dtype=dtype)


def orthogonal_matrix(
    k_proj: int, n: int, seed: int = 0, *, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """R (k_proj, n) with orthonormal rows scaled by √(n/k_proj): E[RᵀR] = I, and RᵀR = I when k_proj = n."""
    _check_k(k_proj, n, "n (orthonormal rows need k_proj ≤ n)")
    gaussian = np.random.default_rng(seed).standard_normal((n, k_proj))
    basis, upper = np.linalg.qr(gaussian)
    basis = basis * np.sign(np.diag(upper))  # Haar-distributed columns
    return torch.from_numpy(basis.T * math.sqrt(n / k_proj)).to(device=device, dtype=dtype)


# ---- input checks --------------------------------------------------------------------------------


def _check_k(k_proj: int, n: int | None = None, what: str = "the sequence length n") -> int:
    if isinstance(k_proj, bool) or not isinstance(k_proj, (int, np.integer)) or k_proj < 1:
        raise SpectraError(f"k_proj must be a positive integer, got {k_proj!r}; pass values ≥ 1 (e.g. --k 16,32,64)")
    if n is not None and k_proj > n:
        raise SpectraError(f"k_proj = {k_proj} exceeds {what} = {n}; drop it from the sweep or use longer sequences")
    return int(k_proj)


def check_sweep(k_projs: Sequence[int], n: int | None = None) -> tuple[int, ...]:
    """k_proj values, each in 1…n; sorted, unique."""
    values = tuple(k_projs)
    if not values:
        raise SpectraError("the k_proj sweep is empty; pass at least one value, e.g. --k 16,32,64,128,256")
    return tuple(sorted({_check_k(value, n) for value in values}))


# ---- bounds (natural log) -------------------------------------------------------------------------


def _gap(eps: float) -> float:
    check_eps(eps)
    return eps**2 - eps**3


def jl_failure_bound(eps: float, k_proj: int) -> float:
    """The JL lemma's failure probability bound 2 e^{−(ε²−ε³) k/4} (may exceed 1: then it says nothing)."""
    return 2.0 * math.exp(-_gap(eps) * _check_k(k_proj) / 4.0)


def theorem1_k(eps: float, n: int) -> float:
    """Theorem 1's k = 5 ln n / (ε² − ε³)."""
    if n < 1:
        raise SpectraError(f"n must be ≥ 1, got {n}")
    return 5.0 * math.log(n) / _gap(eps)


def theorem1_bound(eps: float, n: int, k_proj: int) -> float:
    """Theorem 1's success probability bound max(0, 1 − 2n e^{−(ε²−ε³) k/4}) (the proof's union bound)."""
    if n < 1:
        raise SpectraError(f"n must be ≥ 1, got {n}")
    return max(0.0, 1.0 - n * jl_failure_bound(eps, k_proj))


def theorem2_k(eps: float, n: int, d: int) -> float:
    """Theorem 2's k = min{9 d ln d / ε², 5 ln n / ε²}, the Θ(·) constants taken as 1."""
    check_eps(eps)
    if n < 1 or d < 1:
        raise SpectraError(f"n and d must be ≥ 1, got n = {n} and d = {d}")
    return min(9.0 * d * math.log(d), 5.0 * math.log(n)) / eps**2


def delta_value(rule: str | float, n: int) -> float:
    """Theorem 2's δ for a sequence of n tokens: "1/2^n" (0.0 once it underflows), "1/n", or a constant."""
    if rule == "1/2^n":
        return math.ldexp(1.0, -n)
    if rule == "1/n":
        return 1.0 / n
    if isinstance(rule, (int, float)) and not isinstance(rule, bool) and rule >= 0:
        return float(rule)
    raise SpectraError(f"unknown delta {rule!r}; use '1/2^n', '1/n' or a non-negative number")


def check_deltas(deltas: Sequence[str | float]) -> tuple[str | float, ...]:
    values = tuple(deltas)
    for value in values:
        delta_value(value, 1)
    return values


# ---- errors of single batches ---------------------------------------------------------------------


def _float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _heads(r: torch.Tensor, n: int) -> torch.Tensor:
    """R as (H or 1, k_proj, n): sliced to the first n columns."""
    if r.shape[-1] < n:
        raise SpectraError(f"R has {r.shape[-1]} columns but the sequence has {n}; draw R with n ≥ {n}")
    r = r[..., :n]
    return r[None] if r.dim() == 2 else r


def _tiny(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(torch.finfo(x.dtype).tiny)


def jl_inner_errors(x: torch.Tensor, y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """|x Rᵀ R yᵀ − x yᵀ| / (‖x‖ ‖y‖): the JL lemma's quantity; x, y (…, n), R (…, k_proj, n), broadcast."""
    rx, ry = (r @ x[..., None])[..., 0], (r @ y[..., None])[..., 0]
    return ((rx * ry).sum(-1) - (x * y).sum(-1)).abs() / _tiny(x.norm(dim=-1) * y.norm(dim=-1))


def theorem1_errors(p: torch.Tensor, v: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """‖P̃ w − P w‖ / ‖P w‖ for every column w of v, P̃ = P Rᵀ R: p (B, H, n, n), v (B, H, n, d) → (B, H, d).

    r: (k_proj, ≥n) or (H, k_proj, ≥n), sliced to n columns. P̃ is never formed: P̃ w − P w = P (RᵀR w − w).
    Mask padding beforehand (zero P's padded rows/columns and V's padded rows).
    """
    r = _heads(r, v.shape[-2]).to(device=v.device, dtype=v.dtype)
    heads = max(r.shape[0], v.shape[1])
    r = r.expand(heads, -1, -1)
    back = torch.einsum("hcj,bhcd->bhjd", r, torch.einsum("hcj,bhjd->bhcd", r, v))  # Rᵀ R V
    return (p @ (back - v)).norm(dim=-2) / _tiny((p @ v).norm(dim=-2))


def best_rank_errors(p: torch.Tensor, v: torch.Tensor, k_projs: Sequence[int]) -> torch.Tensor:
    """‖P_k w − P w‖ / ‖P w‖ with P_k the truncated SVD of rank k (Eckart–Young): → (K, B, H, d).

    With P = U Σ Vᵀ and y = Σ Vᵀ w, ‖P_k w − P w‖² = Σ_{i>k} y_i², so one SVD serves the whole sweep.
    """
    _, sigma, vh = torch.linalg.svd(p, full_matrices=False)
    y2 = (sigma[..., None] * (vh @ v)) ** 2  # (B, H, n, d)
    tail = y2.flip(-2).cumsum(-2).flip(-2)  # tail[i] = Σ_{j≥i} y_j²
    tail = torch.cat([tail, torch.zeros_like(tail[..., :1, :])], dim=-2)
    index = torch.tensor([min(k, p.shape[-1]) for k in k_projs], device=p.device)
    return (tail.index_select(-2, index).movedim(-2, 0) / _tiny(tail[..., 0, :])).sqrt()


def theorem2_errors(
    a: torch.Tensor,
    v: torch.Tensor,
    r: torch.Tensor,
    deltas: Sequence[float | torch.Tensor],
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Theorem 2's errors of softmax(w Eᵀ) F V against softmax(w) V, E = δR, F = e^{−δ}R, per row w of a.

    a: scores Q Kᵀ/√d (B, H, n, n) without mask; v (B, H, n, d); r (k_proj, ≥n) or (H, k_proj, ≥n);
    deltas: each a float or one value per sequence (B,); valid (B, n) marks real keys (padded ones are
    dropped from w and V). Returns the row errors (len(deltas), B, H, n) relative to ‖softmax(w)‖₂ ‖V‖_F
    and relative to ‖softmax(w) V‖. w Rᵀ and R V are computed once for all δ.
    """
    batch, heads, n, _ = a.shape
    valid = torch.ones(batch, n, dtype=torch.bool, device=a.device) if valid is None else valid
    keys = valid[:, None, None, :]
    v = v * valid[:, None, :, None].to(v.dtype)
    p = torch.softmax(a.masked_fill(~keys, float("-inf")), dim=-1)
    exact = p @ v
    r = _heads(r, n).to(device=a.device, dtype=a.dtype).expand(heads, -1, -1)
    s = torch.einsum("bhij,hcj->bhic", a.masked_fill(~keys, 0.0), r)  # w Rᵀ (B, H, n, k_proj)
    rv = torch.einsum("hcj,bhjd->bhcd", r, v)  # R V (B, H, k_proj, d)
    rhs = _tiny(p.norm(dim=-1) * v.flatten(-2).norm(dim=-1)[..., None])
    out = _tiny(exact.norm(dim=-1))
    errors = []
    for delta in deltas:
        delta = torch.as_tensor(delta, dtype=torch.float64, device=a.device).expand(batch)
        delta = delta.to(a.dtype)[:, None, None, None]  # float32: δ < ~1e-45 is 0, the δ → 0 limit
        approx = torch.softmax(delta * s, dim=-1) @ (torch.exp(-delta) * rv)
        errors.append((approx - exact).norm(dim=-1))
    err = torch.stack(errors)
    return err / rhs, err / out


class _Cache:
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


# ---- probes --------------------------------------------------------------------------------------


class Theorem1Probe:
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
        self.k_projs = check_sweep(k_projs, n)
        self.eps = check_eps(eps)
        self.methods = ("jl", "svd") if best_rank else ("jl",)
        self.stats = ErrorStats((layers, heads, len(self.k_projs), len(self.methods)), self.eps, per_decade=per_decade)
        self._cache = _Cache()

    def r(self, layer: int, k_proj: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The layer's R (k_proj, n) for this probe's seed (the same numbers on every device)."""
        seed = derive_seed(self.seed, _TAG_T1, layer, k_proj)
        return self._cache.get(("r", layer, k_proj, str(device)), lambda: jl_matrix(k_proj, self.n, seed, device=device))

    def update(
        self, layer: int, q, k, v: torch.Tensor, mask: torch.Tensor | None, p: torch.Tensor, *, scaling: float | None = None
    ) -> None:
        batch, heads, width, _ = v.shape
        _check_shape(self, layer, heads, width)
        valid = key_valid(mask, batch, width, p.device)
        p = masked(_float(p), valid)
        v = _float(v) * valid[:, None, :, None]
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

    def state(self) -> dict[str, np.ndarray]:
        return self.stats.state("theorem1")

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "theorem1")


class Theorem2Probe:
    """Theorem 2 on captured Q, K, V: per row w of A = Q Kᵀ·scaling, errors against softmax(w) V of

    - method "theorem2", variant "delta=<rule>": softmax(w Eᵀ) F V with E = δR, F = e^{−δ}R (R JL,
      per (seed, layer, k_proj), shared by heads), relative_to "rhs" (‖softmax(w)‖₂ ‖V‖_F, the
      theorem's right-hand side) and "output" (‖softmax(w) V‖);
    - method "linformer", variant <sharing>: eq. 7 with JL E, F (`linformer.jl_pair`, the matrices
      `Projections(init="jl", seed=seed, max_len=n)` holds), relative_to "output".

    The score scale is the one the capture attention passes to update (the model's); without one, the
    constructor's `scaling`, else 1/√d. P is checked against softmax(A + mask), so a wrong scale fails loudly.
    Padded keys are dropped from w and V; padded query rows are not counted.
    """

    def __init__(
        self, layers: int, heads: int, n: int, k_projs: Sequence[int], eps: Sequence[float], *, seed: int = 0,
        deltas: Sequence[str | float] = DELTA_RULES, sharing: Sequence[str] | None = None,
        scaling: float | None = None, per_decade: int = 100,
    ) -> None:
        from .linformer import SHARING, check_sharing

        self.layers, self.heads, self.n, self.seed, self.scaling = layers, heads, n, seed, scaling
        self.k_projs = check_sweep(k_projs, n)
        self.eps = check_eps(eps)
        self.deltas = check_deltas(deltas)
        self.sharing = tuple(SHARING if sharing is None else sharing)
        for level in self.sharing:
            check_sharing(level)
        if not self.deltas and not self.sharing:
            raise SpectraError("nothing to measure: pass at least one delta or one sharing level")
        self.variants = [("theorem2", f"delta={rule}", rel) for rule in self.deltas for rel in ("rhs", "output")]
        self.variants += [("linformer", level, "output") for level in self.sharing]
        self.d: int | None = None
        self.stats = ErrorStats((layers, heads, len(self.k_projs), len(self.variants)), self.eps, per_decade=per_decade)
        self._cache = _Cache()

    def r(self, layer: int, k_proj: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The layer's R (k_proj, n) of the δ variants, for this probe's seed."""
        seed = derive_seed(self.seed, _TAG_T2, layer, k_proj)
        return self._cache.get(("r", layer, k_proj, str(device)), lambda: jl_matrix(k_proj, self.n, seed, device=device))

    def update(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, p: torch.Tensor,
        *, scaling: float | None = None,
    ) -> None:
        """`scaling`: the layer's score scale as the capture attention passes it; else the probe's, else 1/√d."""
        from .linformer import jl_pair, linear_attention

        batch, heads, width, d = q.shape
        _check_shape(self, layer, heads, width)
        self.d = d
        q, k, v = _float(q), _float(k), _float(v)
        scaling = scaling if scaling is not None else self.scaling if self.scaling is not None else d**-0.5
        valid = key_valid(mask, batch, width, q.device)
        a = torch.einsum("bhid,bhjd->bhij", q, k) * scaling
        _check_p(a, mask, p)
        lengths = valid.sum(-1).tolist()
        exact = torch.softmax(a.masked_fill(~valid[:, None, None, :], float("-inf")), dim=-1) @ (v * valid[:, None, :, None])
        out_norm = _tiny(exact.norm(dim=-1))
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
                approx = linear_attention(q, k, v, e, f, mask, scaling)
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

    def state(self) -> dict[str, np.ndarray]:
        return {**self.stats.state("theorem2"), "theorem2.d": np.array(self.d or 0)}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "theorem2")
        self.d = int(arrays.get("theorem2.d", 0)) or None


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


def _check_p(a: torch.Tensor, mask: torch.Tensor | None, p: torch.Tensor) -> None:
    """P must be softmax(A + mask); otherwise the model scales scores differently from the probe's scaling."""
    expected = torch.softmax(a if mask is None else a + mask.to(a.dtype), dim=-1)
    tolerance = 1e-3 if p.dtype in (torch.float32, torch.float64) else 5e-2
    if (expected - p.to(a.dtype)).abs().max() > tolerance:
        raise SpectraError(
            "P does not match softmax(q kᵀ·scaling + mask): the model scales attention scores differently; "
            "pass its scaling to Theorem2Probe(scaling=…)"
        )


# ---- synthetic inputs ----------------------------------------------------------------------------


def gaussian_qkv(
    n: int, d: int, *, heads: int = 1, batch: int = 1, seed: int = 0, std: float = 1.0,
    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """i.i.d. N(0, std²) q, k, v of shape (batch, heads, n, d), seeded: the probes' input without a model."""
    if n < 1 or d < 1 or heads < 1 or batch < 1:
        raise SpectraError(f"n, d, heads and batch must be ≥ 1, got {n}, {d}, {heads}, {batch}")
    drawn = np.random.default_rng(derive_seed(seed, 301)).standard_normal((3, batch, heads, n, d)) * std
    q, k, v = torch.from_numpy(drawn).to(device=device, dtype=dtype)
    return q, k, v


def attention_probs(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None, scaling: float | None = None
) -> torch.Tensor:
    """P = softmax(q kᵀ · scaling + mask), as the capture attention computes it (scaling defaults to 1/√d)."""
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    return torch.softmax(scores if mask is None else scores + mask, dim=-1)


def feed(
    probes: Sequence[Probe], layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    mask: torch.Tensor | None = None, scaling: float | None = None,
) -> torch.Tensor:
    """Compute P from q, k (and mask) and hand one layer to every probe, as a forward pass would; returns P."""
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    p = attention_probs(q, k, mask, scaling)
    for probe in probes:
        probe.update(layer, q, k, v, mask, p, scaling=scaling)
    return p


def padding_mask(lengths: Sequence[int], n: int, *, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The additive (B, 1, n, n) key-padding mask of sequences of the given lengths, as transformers builds it."""
    valid = torch.arange(n, device=device)[None, :] < torch.tensor(list(lengths), device=device)[:, None]
    mask = torch.zeros(len(lengths), 1, n, n, dtype=dtype, device=device)
    return mask.masked_fill(~valid[:, None, None, :], torch.finfo(dtype).min)
