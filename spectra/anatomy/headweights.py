"""A weight per (layer, key/value head) from a finished `analyze` or `heads` run — torch-free, read before any model
loads — for the spectrum-guided per-head budget (`presses.headbudget`).

Both runs write metrics.csv, one row per layer and query head of P's spectrum measures, and record the model's
key/value heads in run.json. A head's weight is what its attention is measured to need:

- `entropy` (the default): exp(entropy_mean), the effective number of keys a query of the head attends to — a head
  spreading its attention over many keys is taken to need many of them;
- `rank`: rank90_mean, the singular values of P it takes to reach 90% of their sum — a head whose P needs more
  directions is taken to need more tokens.

A key/value head's weight is the mean over its query heads (the cache is per key/value head). The run is named as
`headbudget(DIR)` or `headbudget(DIR@rank)`; a missing run, a table without the measure or a non-finite weight is one
line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SpectraError

#: measure → (metrics.csv column, how the column becomes a weight)
MEASURES = {"entropy": ("entropy_mean", np.exp), "rank": ("rank90_mean", lambda values: values)}
DEFAULT = "entropy"


def split(argument: str) -> tuple[Path, str]:
    """'DIR@rank' → (DIR, 'rank'); 'DIR' → (DIR, 'entropy')."""
    folder, _, measure = argument.rpartition("@") if "@" in argument else (argument, "", DEFAULT)
    return Path(folder), measure or DEFAULT


def by_head(table: pd.DataFrame, column: str, heads: int, kv_heads: int) -> np.ndarray | None:
    """(layers, heads) float64: metrics.csv's `column` per layer and query head; None where the table does not hold
    every one of the model's `heads` per layer (a run over some heads only) or `kv_heads` does not divide them."""
    per_query = table.pivot_table(index="layer", columns="head", values=column).sort_index(axis=0).sort_index(axis=1)
    if not heads or not kv_heads or per_query.shape[1] != heads or heads % kv_heads:
        return None
    return per_query.to_numpy(dtype=np.float64)


def group_means(per_query: np.ndarray, kv_heads: int) -> np.ndarray:
    """(layers, kv_heads): the mean of (layers, heads) values over each key/value head's query heads (consecutive
    query heads share a key/value head, as transformers' `repeat_kv` lays them out)."""
    return per_query.reshape(len(per_query), kv_heads, -1).mean(-1)


def read(argument: str) -> np.ndarray:
    """(layers, key/value heads) positive weights from the run named by `argument` (see the module docstring)."""
    folder, measure = split(argument)
    if measure not in MEASURES:
        raise SpectraError(f"headbudget({argument}): unknown measure '{measure}'; choose {', '.join(MEASURES)} "
                           "after '@'")
    metrics, meta = folder / "metrics.csv", folder / "run.json"
    if not metrics.is_file() or not meta.is_file():
        raise SpectraError(f"headbudget({argument}): {folder} is not a finished analyze or heads run (it needs "
                           "metrics.csv and run.json)")
    table = pd.read_csv(metrics)
    column, to_weight = MEASURES[measure]
    if column not in table or not {"layer", "head"} <= set(table.columns):
        raise SpectraError(f"headbudget({argument}): {metrics} has no {column} per layer and head")
    model = json.loads(meta.read_text()).get("model", {})
    heads, kv_heads = int(model.get("heads") or 0), int(model.get("kv_heads") or model.get("heads") or 0)
    per_query = by_head(table, column, heads, kv_heads)
    if per_query is None:
        raise SpectraError(f"headbudget({argument}): {metrics} does not hold every one of the model's {heads} heads "
                           "per layer (a run over some heads only)")
    weights = group_means(to_weight(per_query), kv_heads)
    if not np.all(np.isfinite(weights)) or weights.min() <= 0:
        raise SpectraError(f"headbudget({argument}): the {measure} weights are not all finite and positive")
    return weights


def check(argument: str) -> None:
    """The registry's check of `headbudget(DIR[@measure])`'s argument."""
    read(argument)
