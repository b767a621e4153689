"""How a measured quantity grows with the sequence length n: does the k a head needs grow with n?

The Linformer paper claims it need not (Theorem 2: k = O(d log d), independent of n; Theorem 1: O(log n)).
Given one value per n (e.g. the mean rank holding 90% of P's nuclear norm), `growth` fits

- a power law y = c·n^α by least squares in log–log space: α ≈ 0 means k need not grow, α ≈ 1 means k grows
  in proportion to n (attention is not low rank in any useful sense), and in between k grows, but slower;
- the paper's alternative y = a + b·log n by least squares in y,

and reports each model's root-mean-square error in log y (the relative error of its predictions), so the two
are compared on one scale. The 95% interval of α is the percentile interval over bootstrap replicates of the
values (Poisson weights over sequences, `probes.spectrum`): replicate r of every n is fitted in turn. With few
lengths (four or five) the model comparison is a hint, not a test; the interval of α is the number to read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

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


def growth(n: Sequence[float], y: Sequence[float], replicates: np.ndarray | None = None,
           level: float = 0.95) -> Growth:
    """Fit y over the lengths n (one value each); `replicates` (R, len(n)) are bootstrap replicates of y whose
    fitted exponents give α's `level` percentile interval (NaN without replicates)."""
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    alpha, scale = power_fit(n, y)
    a, b = log_fit(n, y)
    low = high = float("nan")
    if replicates is not None and len(replicates) and np.isfinite(alpha):
        alphas = np.array([power_fit(n, replicate)[0] for replicate in np.asarray(replicates, dtype=float)])
        alphas = alphas[np.isfinite(alphas)]
        if alphas.size:
            tail = (1 - level) / 2 * 100
            low, high = (float(value) for value in np.percentile(alphas, [tail, 100 - tail]))
    return Growth(alpha, low, high, scale, a, b, _rmse_log(scale * n ** alpha, y), _rmse_log(a + b * np.log(n), y),
                  int(np.isfinite(y).sum()))
