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
    failed = run.evicted
    if len(failed):
        lost = failed[failed["evicted"] > 0]
        out.print(f"{plural(len(failed), 'cell')} scored below the full cache; in {len(lost)} of them some layer's "
                  f"heads all evicted the needle (task_evicted.csv)")
    out.print(f"written to {run.path}")
