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

QUANTILES = {"median": 0.5, "p95": 0.95}
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


def check_eps(eps: Sequence[float] | float) -> tuple[float, ...]:
    """ε values, each strictly inside (0, 1) (the ε² − ε³ of the bounds needs it); sorted, unique."""
    values = (eps,) if isinstance(eps, (int, float)) else tuple(eps)
    if not values:
        raise SpectraError("the ε list is empty; pass at least one value in (0, 1), e.g. --eps 0.1,0.2,0.3,0.5")
    for value in values:
        if not 0.0 < float(value) < 1.0:
            raise SpectraError(f"ε must lie strictly between 0 and 1, got {value}; pass e.g. --eps 0.1,0.2,0.3,0.5")
    return tuple(sorted({float(value) for value in values}))


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


# ---- streaming statistics ------------------------------------------------------------------------


class ErrorStats:
    """Per-cell streaming summaries of relative errors: exact Pr(error ≤ ε), histogram quantiles, mean, max.

    The histogram has `per_decade` bins per decade of log10(error) over [lo, hi] plus an under- and an
    overflow bin; quantiles interpolate within a bin (log-linearly) and are clipped to the exact min and
    max, so they are accurate to a fraction of one bin (10^(1/per_decade) − 1 ≈ 2.3% by default). All
    sums are integer counts or float64 totals: the result does not depend on how samples are batched.
    """

    def __init__(
        self, cells: tuple[int, ...], eps: Sequence[float], lo: float = -6.0, hi: float = 3.0, per_decade: int = 100
    ) -> None:
        self.cells, self.eps, self.lo, self.hi, self.per_decade = tuple(cells), check_eps(eps), lo, hi, per_decade
        self.bins = int(round((hi - lo) * per_decade))
        self.count = np.zeros(self.cells, np.int64)
        self.below = np.zeros(self.cells + (len(self.eps),), np.int64)
        self.hist = np.zeros(self.cells + (self.bins + 2,), np.int64)
        self.total = np.zeros(self.cells, np.float64)
        self.min = np.full(self.cells, np.inf)
        self.max = np.full(self.cells, -np.inf)

    def add(self, index: int | tuple[int, ...], errors: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Add samples errors (*cells[len(index):], S) to the cells under `index`; keep (broadcastable) selects samples.

        NaN errors count as +inf (failures), never silently dropped.
        """
        index = (index,) if isinstance(index, int) else tuple(index)
        shape = self.cells[len(index):]
        if tuple(errors.shape[:-1]) != shape:
            raise ValueError(f"errors of shape {tuple(errors.shape)} do not fit cells {shape} + (samples,)")
        errors = torch.nan_to_num(errors.detach().to(torch.float64), nan=math.inf)
        keep = torch.ones_like(errors, dtype=torch.bool) if keep is None else keep.to(errors.device).expand_as(errors)
        eps = torch.tensor(self.eps, dtype=torch.float64, device=errors.device)
        below = ((errors[..., None] <= eps) & keep[..., None]).sum(-2)
        log = (torch.log10(errors) - self.lo) * self.per_decade + 1
        bins = torch.where(errors > 0, log, torch.zeros_like(log)).floor().clamp(0, self.bins + 1).long()
        cell = torch.arange(math.prod(shape), device=errors.device).view(*shape, 1)
        flat = (cell * (self.bins + 2) + bins)[keep]
        hist = torch.bincount(flat, minlength=math.prod(shape) * (self.bins + 2)).view(*shape, self.bins + 2)
        inf = torch.tensor(math.inf, dtype=torch.float64, device=errors.device)
        self.count[index] += keep.sum(-1).cpu().numpy()
        self.below[index] += below.cpu().numpy()
        self.hist[index] += hist.cpu().numpy()
        self.total[index] += torch.where(keep, errors, 0.0).sum(-1).cpu().numpy()
        self.min[index] = np.minimum(self.min[index], torch.where(keep, errors, inf).amin(-1).cpu().numpy())
        self.max[index] = np.maximum(self.max[index], torch.where(keep, errors, -inf).amax(-1).cpu().numpy())

    def quantile(self, q: float) -> np.ndarray:
        """The q-quantile of every cell from its histogram (NaN for empty cells)."""
        hist = self.hist.reshape(-1, self.bins + 2).astype(np.float64)
        low, high = self.min.reshape(-1), self.max.reshape(-1)
        cum = hist.cumsum(1)
        count = cum[:, -1]
        target = q * count
        j = np.minimum((cum < target[:, None]).sum(1), self.bins + 1)
        rows = np.arange(len(j))
        before = np.where(j > 0, cum[rows, np.maximum(j - 1, 0)], 0.0)
        frac = np.clip((target - before) / np.maximum(hist[rows, j], 1.0), 0.0, 1.0)
        with np.errstate(invalid="ignore", over="ignore"):
            log_value = 10.0 ** (self.lo + (j - 1 + frac) / self.per_decade)
            under = low + frac * (np.minimum(10.0**self.lo, high) - low)
            over_start = np.maximum(10.0**self.hi, low)
            over = np.where(np.isinf(high), np.where(frac > 0, high, over_start), over_start + frac * (high - over_start))
            value = np.where(j == 0, under, np.where(j == self.bins + 1, over, log_value))
            value = np.clip(value, low, high)
        return np.where(count > 0, value, np.nan).reshape(self.cells)

    def frame(self, axes: dict[str, Sequence]) -> pd.DataFrame:
        """Long table: one row per cell (labelled by `axes`, one entry per cell axis) and ε."""
        if len(axes) != len(self.cells) or any(len(labels) != size for labels, size in zip(axes.values(), self.cells)):
            raise ValueError(f"axes {list(axes)} do not label cells {self.cells}")
        grid = np.indices(self.cells).reshape(len(self.cells), -1)
        count = self.count.reshape(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            summary = {
                "samples": count,
                **{name: self.quantile(q).reshape(-1) for name, q in QUANTILES.items()},
                "mean": np.where(count > 0, self.total.reshape(-1) / np.maximum(count, 1), np.nan),
                "max": np.where(count > 0, self.max.reshape(-1), np.nan),
            }
            pr = self.below.reshape(-1, len(self.eps)) / np.maximum(count, 1)[:, None]
        pr[count == 0] = np.nan
        repeat = len(self.eps)
        columns: dict[str, np.ndarray] = {}
        for axis, (name, labels) in enumerate(axes.items()):
            columns[name] = np.repeat(np.asarray(list(labels), dtype=object)[grid[axis]], repeat)
        columns["eps"] = np.tile(np.asarray(self.eps), len(count))
        columns["pr"] = pr.reshape(-1)
        for name, values in summary.items():
            columns[name] = np.repeat(values, repeat)
        table = pd.DataFrame(columns)
        typed = {name: type(labels[0]) for name, labels in axes.items() if isinstance(labels[0], (int, np.integer, str))}
        return table.astype(typed)

    def pooled(self, axes: tuple[int, ...]) -> "ErrorStats":
        """The same statistics with the cell axes `axes` pooled (e.g. over layers and heads): counts and
        totals add up, min/max reduce, so quantiles of the pooled cells are exact histogram quantiles."""
        keep = tuple(size for axis, size in enumerate(self.cells) if axis not in axes)
        pooled = ErrorStats(keep, self.eps, self.lo, self.hi, self.per_decade)
        pooled.count, pooled.below, pooled.hist = self.count.sum(axes), self.below.sum(axes), self.hist.sum(axes)
        pooled.total, pooled.min, pooled.max = self.total.sum(axes), self.min.min(axes), self.max.max(axes)
        return pooled

    def state(self, prefix: str) -> dict[str, np.ndarray]:
        names = ("count", "below", "hist", "total", "min", "max")
        return {f"{prefix}.{name}": getattr(self, name) for name in names}

    def load_state(self, arrays: dict[str, np.ndarray], prefix: str) -> None:
        for name in ("count", "below", "hist", "total", "min", "max"):
            value = np.array(arrays[f"{prefix}.{name}"])
            if value.shape != getattr(self, name).shape:
                expected = getattr(self, name).shape
                raise SpectraError(f"checkpoint array {prefix}.{name} has shape {value.shape}, expected {expected}")
            setattr(self, name, value)


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
