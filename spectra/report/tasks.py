"""A task run of `spectra cache` read back and printed: the run object and the console tables (its figures are
`report/plots/tasks.py`).

A task run (run.json's `protocol` is "tasks") holds `examples` (task_examples.csv: per press, ratio and example the
prediction and its score, the share of context rows kept, the share of the needle kept over layers and heads),
`scores` (task_scores.csv: per press, ratio and task the mean score, the full cache's on the same examples, the
difference, with bootstrap intervals), `lengths` (task_lengths.csv: the same per task and length), `needle`
(task_needle.csv: per press, ratio, layer and key/value head the needle kept and the full cache's attention on it) and
`evicted` (task_evicted.csv: per example a press failed — scored below the full cache — the layers where no head kept
the needle); needle.npz holds the per-example arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runs import Shown, read_table

if TYPE_CHECKING:
    import pandas as pd


@dataclass(repr=False)
class TaskRun(Shown):
    """A `spectra cache` run of the task protocol (see the module docstring)."""

    path: Path
    meta: dict[str, Any]
    examples: pd.DataFrame
    scores: pd.DataFrame
    lengths: pd.DataFrame
    needle: pd.DataFrame
    evicted: pd.DataFrame

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"

    def arrays(self) -> dict[str, Any]:
        """needle.npz: survival (cells, examples, layers, key/value heads), mass (examples, layers, key/value heads),
        press, ratio (per cell) and example (line indices)."""
        from ..runs import read_arrays

        return read_arrays(self.path / "needle.npz")


def load_tasks(path: Path, meta: dict[str, Any]) -> TaskRun:
    """A finished task run's tables (predictions kept as text: an answer such as "007" stays a string)."""
    text = {"prediction": str, "evicted_layers": str, "task": str}
    return TaskRun(path, meta, read_table(path, "task_examples.csv", dtype=text, keep_default_na=False,
                                          na_values={"depth": [""]}),
                   read_table(path, "task_scores.csv", dtype=text), read_table(path, "task_lengths.csv", dtype=text),
                   read_table(path, "task_needle.csv"),
                   read_table(path, "task_evicted.csv", dtype=text, keep_default_na=False, na_values={"depth": [""]}))


def needle_vs_score(run: TaskRun) -> pd.DataFrame:
    """Whether keeping the needle predicts answering: per press (and "all"), over its compressed cells with a needle
    on examples the full cache answered (score 1), the cells `answered` (score 1) and `missed`, the mean share of
    the needle kept in each group, and the AUC — the probability that an answered cell kept more of the needle than
    a missed one (ties count half; NaN without both groups)."""
    import numpy as np
    import pandas as pd

    examples = run.examples
    full = examples[examples["press"] == "full"].set_index("example")["score"]
    cells = examples[(examples["press"] != "full") & examples["needle_kept"].notna()]
    cells = cells[cells["example"].map(full) == 1]
    rows = []
    for press, group in [*cells.groupby("press", sort=False), ("all", cells)]:
        hit = group[group["score"] == 1]["needle_kept"].to_numpy()
        miss = group[group["score"] < 1]["needle_kept"].to_numpy()
        auc = (float(((hit[:, None] > miss[None]) + 0.5 * (hit[:, None] == miss[None])).mean())
               if hit.size and miss.size else float("nan"))
        rows.append({"press": press, "answered": hit.size, "missed": miss.size,
                     "kept_answered": hit.mean() if hit.size else np.nan,
                     "kept_missed": miss.mean() if miss.size else np.nan, "auc": auc})
    return pd.DataFrame(rows)


def print_tasks(run: TaskRun) -> None:
    """Per task, press and ratio: the mean score beside the full cache's, the paired difference and its interval."""
    from .console import out, plural, print_frame

    meta = run.meta
    table = run.scores[["task", "press", "ratio", "examples", "score", "low", "high", "full", "delta", "delta_low",
                        "delta_high"]].sort_values(["task", "press", "ratio"], kind="stable")
    aware = "context + question compressed" if meta.get("query_aware") else "question appended uncompressed"
    print_frame(table, f"{run.label}: {plural(meta.get('examples', meta.get('samples', 0)), 'example')}, {aware}; "
                "mean score per task (RULER's string match) beside the full cache's on the same examples, the "
                "difference, 95% bootstrap intervals over examples",
                digits={"ratio": 3, "score": 3, "low": 3, "high": 3, "full": 3, "delta": 3, "delta_low": 3,
                        "delta_high": 3})
    predicts = needle_vs_score(run)
    if (predicts["answered"] + predicts["missed"]).sum():
        print_frame(predicts, "does keeping the needle predict the answer? compressed cells of examples the full cache "
                    "answered: the needle's share kept (mean over layers and heads) when answered and when missed, "
                    "and the AUC (1: every answered cell kept more of it than every missed one; 0.5: no relation)",
                    digits={"kept_answered": 3, "kept_missed": 3, "auc": 3})
    failed = run.evicted
    if len(failed):
        lost = failed[failed["evicted"] > 0]
        out.print(f"{plural(len(failed), 'cell')} scored below the full cache; in {len(lost)} of them some layer's "
                  f"heads all evicted the needle (task_evicted.csv)")
    out.print(f"written to {run.path}")
