"""Independent reference computations the tests hold spectra's numbers against (scipy/numpy in float64)."""

from __future__ import annotations

import numpy as np
import scipy.linalg


def spectrum_reference(p: np.ndarray, at: int, size: int, sink_from: int | None = None
                       ) -> tuple[np.ndarray, dict[str, float]]:
    """Curve on the relative grid and the metrics of one m×m matrix (its valid block), in float64 with scipy;
    the sink mass counts queries from `sink_from` on (default: spectra's rule, 16 or size/8)."""
    m = p.shape[0]
    sigma = scipy.linalg.svdvals(p.astype(np.float64))
    cum = np.cumsum(sigma) / sigma.sum()
    grid = np.interp(np.arange(1, size + 1) / size, np.arange(0, m + 1) / m, np.concatenate([[0.0], cum]))
    share = sigma / sigma.sum()
    share = share[share > 0]
    metrics = {
        "sigma1": sigma[0],
        "nuclear": sigma.sum(),
        "stable_rank": np.linalg.norm(p, "fro") ** 2 / np.linalg.norm(p, 2) ** 2,
        "erank": np.exp(-(share * np.log(share)).sum()),
        "rank90": next(i + 1 for i, c in enumerate(cum) if c >= 0.9),
        "rank99": next(i + 1 for i, c in enumerate(cum) if c >= 0.99),
        "c_at": grid[at - 1],
        "length": m,
    }
    begin = min(max(1, min(16, size // 8)) if sink_from is None else sink_from, m - 1)
    rows = p.astype(np.float64)
    metrics["sink"] = rows[begin:, 0].mean()
    metrics["entropy"] = np.mean([-(row[row > 0] * np.log(row[row > 0])).sum() for row in rows])
    return grid, metrics
