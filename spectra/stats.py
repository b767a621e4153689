"""Streaming statistics whose memory does not grow with the number of samples, and whose states add up.

`Moments` keeps count, sum and sum of squares (mean and standard deviation); `ErrorStats` keeps exact
threshold counts and a log-spaced histogram (quantiles). Both hold plain arrays, so a run can checkpoint
them, resume them, and combine the states of several processes: a `State` maps each array's name to
the array and how it combines (`Reduce`: summed, or reduced by min or max). `wilson` and `clopper_pearson`
bound a proportion (`ClusterStats` and the leaderboard's cells where every example agrees).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .config import check_eps
from .errors import SpectraError

QUANTILES = {"median": 0.5, "p95": 0.95}


class Reduce(enum.Enum):
    """How one state array combines across processes."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"


@dataclass(frozen=True)
class Tagged:
    """A state array and how it combines across processes."""

    array: np.ndarray
    reduce: Reduce = Reduce.SUM


#: a probe's state: array name → array and its reduction
State = dict[str, Tagged]


def plain(state: State) -> dict[str, np.ndarray]:
    """The arrays of a state (what a checkpoint stores; the reductions are fixed by the probe)."""
    return {name: part.array for name, part in state.items()}


def tagged(arrays: Mapping[str, np.ndarray], reduce: Reduce = Reduce.SUM) -> State:
    return {name: Tagged(np.asarray(array), reduce) for name, array in arrays.items()}


@dataclass
class Moments:
    """Streaming count, sum and sum of squares in float64: mean and std without holding the samples."""

    count: np.ndarray
    total: np.ndarray
    total_sq: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> Moments:
        return cls(np.zeros(shape[:-1] if len(shape) > 1 else (), np.float64), np.zeros(shape), np.zeros(shape))

    def add(self, index: int, x: torch.Tensor) -> None:
        """Add samples x (S, *shape[1:]) — S along axis 0 — to slot `index` of the leading axis."""
        x = x.detach().to("cpu", torch.float64).numpy()
        self.count[index] += x.shape[0]
        self.total[index] += x.sum(0)
        self.total_sq[index] += (x * x).sum(0)

    @property
    def mean(self) -> np.ndarray:
        return self.total / self._count()

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation over the samples (ddof = 0)."""
        return np.sqrt(np.maximum(self.total_sq / self._count() - self.mean**2, 0.0))

    def _count(self) -> np.ndarray:
        count = np.maximum(self.count, 1)
        return count.reshape(count.shape + (1,) * (self.total.ndim - count.ndim))

    def state(self, prefix: str) -> State:
        return tagged({f"{prefix}.count": self.count, f"{prefix}.total": self.total, f"{prefix}.total_sq": self.total_sq})

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str) -> Moments:
        return cls(*(np.array(arrays[f"{prefix}.{name}"]) for name in ("count", "total", "total_sq")))


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
        self.total_sq = np.zeros(self.cells, np.float64)
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
        if errors.device.type == "mps":  # no float64 on Apple GPUs
            errors, keep = errors.cpu(), None if keep is None else keep.cpu()
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
        kept = torch.where(keep, errors, 0.0)
        self.total[index] += kept.sum(-1).cpu().numpy()
        self.total_sq[index] += torch.where(torch.isfinite(kept), kept * kept, math.inf).sum(-1).cpu().numpy()
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

    def frame(self, axes: dict[str, Sequence], mean_interval: bool = False) -> pd.DataFrame:
        """Long table: one row per cell (labelled by `axes`, one entry per cell axis) and ε. With `mean_interval`
        (independent samples only), the mean's 95% Student-t interval: mean_low, mean_high."""
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
            if mean_interval:
                mean = summary["mean"]
                var = np.maximum(self.total_sq.reshape(-1) / np.maximum(count, 1) - mean**2, 0) * count / np.maximum(
                    count - 1, 1)
                half = t_quantile(count) * np.sqrt(var / np.maximum(count, 1))
                summary.update(mean_low=mean - half, mean_high=mean + half)
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

    def pooled(self, axes: tuple[int, ...]) -> ErrorStats:
        """The same statistics with the cell axes `axes` pooled (e.g. over layers and heads): counts and
        totals add up, min/max reduce, so quantiles of the pooled cells are exact histogram quantiles."""
        keep = tuple(size for axis, size in enumerate(self.cells) if axis not in axes)
        pooled = ErrorStats(keep, self.eps, self.lo, self.hi, self.per_decade)
        pooled.count, pooled.below, pooled.hist = self.count.sum(axes), self.below.sum(axes), self.hist.sum(axes)
        pooled.total, pooled.min, pooled.max = self.total.sum(axes), self.min.min(axes), self.max.max(axes)
        pooled.total_sq = self.total_sq.sum(axes)
        return pooled

    def state(self, prefix: str) -> State:
        reduce = {"min": Reduce.MIN, "max": Reduce.MAX}
        return {f"{prefix}.{name}": Tagged(getattr(self, name), reduce.get(name, Reduce.SUM))
                for name in ("count", "below", "hist", "total", "total_sq", "min", "max")}

    def load_state(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        for name in ("count", "below", "hist", "total", "total_sq", "min", "max"):
            value = np.array(arrays[f"{prefix}.{name}"])
            if value.shape != getattr(self, name).shape:
                expected = getattr(self, name).shape
                raise SpectraError(f"checkpoint array {prefix}.{name} has shape {value.shape}, expected {expected}")
            setattr(self, name, value)


def t_quantile(count: np.ndarray) -> np.ndarray:
    """The 97.5% quantile of Student's t with count − 1 degrees of freedom (NaN below 2)."""
    from scipy.stats import t as student

    count = np.asarray(count, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.where(count >= 2, student.ppf(0.975, np.maximum(count - 1, 1)), np.nan)


def wilson(p: np.ndarray, count: np.ndarray, z: float = 1.959963984540054) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's 95% score interval for a proportion p observed over `count` independent trials.

    At p = 0 the low end is exactly 0 and at p = 1 the high end exactly 1 (the formula's centre − half and
    centre + half equal them only up to rounding, which left 5.5e-17 and 0.9999999999999999), and the interval
    always contains p."""
    p = np.asarray(p, dtype=float)
    count = np.maximum(np.asarray(count, dtype=float), 1.0)
    centre = (p + z * z / (2 * count)) / (1 + z * z / count)
    half = z * np.sqrt(p * (1 - p) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    low = np.where(p <= 0, 0.0, np.clip(np.minimum(centre - half, p), 0, 1))
    high = np.where(p >= 1, 1.0, np.clip(np.maximum(centre + half, p), 0, 1))
    return low, high


def clopper_pearson(successes: np.ndarray, count: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Clopper and Pearson's exact binomial interval for `successes` of `count` independent trials: the Beta
    quantiles Beta((1 − level)/2; s, n − s + 1) and Beta((1 + level)/2; s + 1, n − s), 0 at s = 0 and 1 at s = n.
    Where every trial agrees it still has width (1 − ((1 − level)/2)^(1/n) at s = 0), where a bootstrap has none."""
    from scipy.stats import beta

    successes, count = np.asarray(successes, dtype=float), np.asarray(count, dtype=float)
    tail = (1 - level) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        failures = count - successes
        low = np.where(successes <= 0, 0.0, beta.ppf(tail, np.maximum(successes, 1e-300), failures + 1))
        high = np.where(failures <= 0, 1.0, beta.ppf(1 - tail, successes + 1, np.maximum(failures, 1e-300)))
    return low, high


class ClusterStats:
    """Success rates over clusters of correlated samples, with a confidence interval that respects them.

    The samples of one cluster (e.g. every column of V of one sequence, all sharing that sequence's random
    projection) are not independent, so a binomial interval over samples would be far too narrow. Each
    cluster contributes its success fraction f (samples ≤ ε over its samples); per cell and ε the state
    keeps Σf, Σf² and the number of clusters, so the mean over clusters gets a Student-t 95% interval
    (Wilson's over clusters when every cluster agreed). Per draw (several independent random projections
    per sequence) it keeps successes and totals, for the spread of the rate across draws. Plain arrays: they
    checkpoint, resume and add up across processes.
    """

    def __init__(self, cells: tuple[int, ...], eps: Sequence[float], draws: int = 1) -> None:
        self.cells, self.eps, self.draws = tuple(cells), check_eps(eps), draws
        shape = self.cells + (len(self.eps),)
        self.total, self.total_sq, self.clusters = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.draw_below, self.draw_count = np.zeros(shape + (draws,)), np.zeros(shape + (draws,))

    def add(self, index: int | tuple[int, ...], below: torch.Tensor, count: torch.Tensor) -> None:
        """Add clusters: `below` (*cells[len(index):], eps, draws, clusters) successes and `count` (same shape,
        or broadcastable) samples per (draw, cluster); clusters with no sample are left out."""
        index = (index,) if isinstance(index, int) else tuple(index)
        below = below.detach().to("cpu", torch.float64).numpy()
        count = np.broadcast_to(count.detach().to("cpu", torch.float64).numpy(), below.shape)
        per_cluster_below, per_cluster = below.sum(-2), count.sum(-2)  # over draws
        present = per_cluster > 0
        fraction = np.where(present, per_cluster_below / np.maximum(per_cluster, 1), 0.0)
        self.total[index] += fraction.sum(-1)
        self.total_sq[index] += (fraction**2).sum(-1)
        self.clusters[index] += present.sum(-1)
        self.draw_below[index] += below.sum(-1)
        self.draw_count[index] += count.sum(-1)

    def pooled(self, axes: tuple[int, ...]) -> ClusterStats:
        """Cells summed over `axes` (clusters of different cells counted as separate clusters)."""
        keep = tuple(size for axis, size in enumerate(self.cells) if axis not in axes)
        pooled = ClusterStats(keep, self.eps, self.draws)
        for name in ("total", "total_sq", "clusters", "draw_below", "draw_count"):
            setattr(pooled, name, getattr(self, name).sum(axes))
        return pooled

    def interval(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mean over clusters and its 95% interval (cells…, eps), clipped to [0, 1]; NaN without clusters."""
        count = self.clusters
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self.total / count
            var = np.maximum(self.total_sq / count - mean**2, 0.0) * count / np.maximum(count - 1, 1)
            half = t_quantile(count) * np.sqrt(var / count)
            low, high = np.clip(mean - half, 0, 1), np.clip(mean + half, 0, 1)
            degenerate = (var == 0) | (count < 2)
            wilson_low, wilson_high = wilson(mean, count)
        low, high = np.where(degenerate, wilson_low, low), np.where(degenerate, wilson_high, high)
        empty = count == 0
        return (np.where(empty, np.nan, mean), np.where(empty, np.nan, low), np.where(empty, np.nan, high))

    def draw_spread(self) -> np.ndarray:
        """Standard deviation across draws of the success rate (cells…, eps): NaN with one draw."""
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = self.draw_below / self.draw_count
            return np.nanstd(rates, axis=-1, ddof=1) if self.draws > 1 else np.full(rates.shape[:-1], np.nan)

    def state(self, prefix: str) -> State:
        return tagged({f"{prefix}.{name}": getattr(self, name)
                       for name in ("total", "total_sq", "clusters", "draw_below", "draw_count")})

    def load_state(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        for name in ("total", "total_sq", "clusters", "draw_below", "draw_count"):
            setattr(self, name, np.array(arrays[f"{prefix}.{name}"]))
