"""How a measured quantity grows with the sequence length n: does the k a head needs grow with n?

The Linformer paper claims it need not (Theorem 2: k = O(d log d), independent of n; Theorem 1: O(log n)).
Given one value per n (e.g. the mean rank holding 90% of P's nuclear norm), `growth` fits

- a power law y = c·n^α by least squares in log–log space: α ≈ 0 means k need not grow, α ≈ 1 means k grows
  in proportion to n (attention is not low rank in any useful sense), and in between k grows, but slower;
- the paper's alternative y = a + b·log n by least squares in y,

and reports each model's root-mean-square error in log y (the relative error of its predictions), so the two
are compared on one scale. With few lengths (four or five) the model comparison is a hint, not a test; the
interval of α is the number to read.

The interval of α comes from Poisson-bootstrap replicates of the values over sequences (`probes.spectrum`):
replicate r of every n weights sequence i by the same draws, seeded by its global index, and is fitted in
turn. Sharing the weights across n is what a bootstrap over sequences must do when the same sequences feed
every n (truncate mode: sequence i is document i at every n), so the replicates keep the correlation between
the per-n means. In pack mode sequence i is a different token block at each n; the true per-n means are then
positively correlated through the text they share (the blocks at n are the first part of those at 2n) while
the replicates are not, which makes the interval slightly conservative for a slope (in simulation of that
case, 95.5% coverage with 64 sequences). The interval is α̂ ± t · √(S/(S − 1)) · sd(α*), the bootstrap standard
error of α with the small-sample factor of a bootstrap of S sequences and Student's t with S − 1 degrees of
freedom: the plain percentile interval of α* covers too seldom with few sequences (82–85% instead of 95% at
S = 4, about 90% at S = 8, in simulation), this one covers 93–98% from S = 4 on (tests/test_growth.py). It
is an interval for the least-squares slope of log E[y] on log n at the measured lengths; where y is not a
power law of n that slope depends on the lengths chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Growth:
    """The fits of one quantity over the lengths: y ≈ scale·n^alpha and y ≈ log_a + log_b·log n."""

    alpha: float
    alpha_low: float
    alpha_high: float
    scale: float
    log_a: float
    log_b: float
    rmse_power: float
    rmse_log: float
    lengths: int

    def row(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def better(self) -> str:
        """'power' or 'log': the model with the smaller error in log y ('' when either is undefined; a model
        that predicts a non-positive rank somewhere has an infinite error and loses)."""
        if np.isnan(self.rmse_power) or np.isnan(self.rmse_log) or np.isinf(self.rmse_power) and np.isinf(self.rmse_log):
            return ""
        if abs(self.rmse_log - self.rmse_power) < 1e-9:
            return ""  # both exact (e.g. a constant): no preference
        return "log" if self.rmse_log < self.rmse_power else "power"


def power_fit(n: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(α, c) of y = c·n^α by least squares of log y on log n; NaN when fewer than two positive values."""
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(y) & (y > 0)
    if np.unique(n[keep]).size < 2:
        return float("nan"), float("nan")
    alpha, log_c = np.polyfit(np.log(n[keep]), np.log(y[keep]), 1)
    return float(alpha), float(np.exp(log_c))


def log_fit(n: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(a, b) of y = a + b·log n by least squares in y; NaN when fewer than two finite values."""
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(y)
    if np.unique(n[keep]).size < 2:
        return float("nan"), float("nan")
    b, a = np.polyfit(np.log(n[keep]), y[keep], 1)
    return float(a), float(b)


def _rmse_log(predicted: np.ndarray, y: np.ndarray) -> float:
    """Root-mean-square of log(predicted / y): NaN when a value is not positive (undefined), infinite when a
    prediction is not positive (a + b·log n through fast growth goes negative at small n: it cannot fit)."""
    keep = np.isfinite(y)
    if not keep.any() or (y[keep] <= 0).any():
        return float("nan")
    if (predicted[keep] <= 0).any():
        return float("inf")
    return float(np.sqrt(np.mean(np.log(predicted[keep] / y[keep]) ** 2)))


def alpha_interval(n: np.ndarray, y: np.ndarray, alpha: float, replicates: np.ndarray, sequences: int,
                   level: float) -> tuple[float, float]:
    """α's `level` interval from bootstrap replicates (R, len(n)) of y over `sequences` sequences (see the module
    docstring): α ± t · √(S/(S − 1)) · sd of the replicates' α. A replicate is fitted on the lengths y has; one
    missing a value there (every weight of that n drawn 0) is left out. NaN with fewer than two sequences or
    two usable replicates."""
    from scipy.stats import t as student

    used = np.isfinite(y) & (y > 0)
    replicates = np.asarray(replicates, dtype=float)
    whole = np.isfinite(replicates[:, used]).all(axis=1) & (replicates[:, used] > 0).all(axis=1)
    alphas = np.array([power_fit(n[used], replicate[used])[0] for replicate in replicates[whole]])
    if sequences < 2 or alphas.size < 2:
        return float("nan"), float("nan")
    half = student.ppf((1 + level) / 2, sequences - 1) * np.sqrt(sequences / (sequences - 1)) * alphas.std(ddof=1)
    return float(alpha - half), float(alpha + half)


def growth(n: Sequence[float], y: Sequence[float], replicates: np.ndarray | None = None,
           sequences: int | None = None, level: float = 0.95) -> Growth:
    """Fit y over the lengths n (one value each); `replicates` (R, len(n)), Poisson-bootstrap replicates of y over
    `sequences` sequences (the fewest any length had), give α's `level` interval (NaN without replicates)."""
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    alpha, scale = power_fit(n, y)
    a, b = log_fit(n, y)
    low = high = float("nan")
    if replicates is not None and len(replicates) and np.isfinite(alpha):
        if sequences is None:
            raise ValueError("an interval from bootstrap replicates needs the number of sequences they resample")
        low, high = alpha_interval(n, y, alpha, replicates, sequences, level)
    return Growth(alpha, low, high, scale, a, b, _rmse_log(scale * n ** alpha, y), _rmse_log(a + b * np.log(n), y),
                  int(np.isfinite(y).sum()))
