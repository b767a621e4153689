"""Numbers that follow from a run's spectra: c at an index, rank trends, the nonuniform k plan, comparisons.

Pure numpy/pandas on `Run` objects. The plan implements the paper's "nonuniform projected dimension"
(Linformer, section 4): a layer (or head) whose mean normalized cumulative singular value reaches the
energy E at a small index can be projected to that many rows, so higher, lower-rank layers get a smaller
k_proj than lower ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import SpectraError
from .runs import Run, load_run


def load_analyze(path: str | Path) -> Run:
    """A finished `spectra analyze` run; any other directory is a one-line SpectraError."""
    run = load_run(path)
    if not isinstance(run, Run):
        raise SpectraError(f"{path} holds a '{run.meta.get('kind')}' run; this needs a run of 'spectra analyze'")
    return run


def default_at(n: int) -> int:
    """The paper's heatmap index n/4 (128 for n = 512), at least 1."""
    return max(1, n // 4)


def check_at(run: Run, at: int) -> int:
    """`at` if it is a 1-based index of the run's curves, else a one-line SpectraError."""
    if not 1 <= at <= run.n:
        raise SpectraError(f"--at must be an index in 1…{run.n} (the sequence length of {run.path}), got {at}")
    return at


def c_at(run: Run, at: int | None = None) -> np.ndarray:
    """Mean normalized cumulative singular value at 1-based index `at`, shape (layers, heads).

    For the run's stored `at` this is the metrics table's c_at_mean; for any other index it is the mean
    curve cum_mean at that grid index (the same quantity: both average c over sequences).
    """
    at = run.at if at is None else check_at(run, at)
    if at == run.at:
        table = run.metrics.sort_values(["layer", "head"])
        return table["c_at_mean"].to_numpy(float).reshape(run.layers, run.heads)
    return np.asarray(run.cum_mean[:, :, at - 1], dtype=float)


def metric_grid(run: Run, column: str) -> np.ndarray:
    """A metrics column (e.g. rank90_mean) as a (layers, heads) array, layer down and head across."""
    if column not in run.metrics.columns:
        raise SpectraError(f"{run.path} has no metric '{column}'; its metrics are {', '.join(run.metrics.columns)}")
    table = run.metrics.sort_values(["layer", "head"])
    return table[column].to_numpy(float).reshape(run.layers, run.heads)


def layer_trend(values: np.ndarray) -> float:
    """Spearman rank correlation between layer index and the per-layer mean of `values` (layers, heads).

    Positive when higher layers have a larger c at the index, i.e. are more skewed (lower rank), as the
    paper states; NaN when there are fewer than two layers or the means are constant.
    """
    from scipy.stats import spearmanr

    means = np.asarray(values, dtype=float).mean(axis=1)
    if means.size < 2 or np.ptp(means) == 0:
        return float("nan")
    return float(spearmanr(np.arange(means.size), means).statistic)


def per_layer(run: Run, at: int | None = None) -> pd.DataFrame:
    """One row per layer: mean over heads of c at the index and of the ranks needed for 90% and 99%."""
    at = run.at if at is None else check_at(run, at)
    return pd.DataFrame(
        {
            "layer": np.arange(run.layers),
            "c_at": c_at(run, at).mean(axis=1),
            "rank90": metric_grid(run, "rank90_mean").mean(axis=1),
            "rank99": metric_grid(run, "rank99_mean").mean(axis=1),
        }
    )


def headline(run: Run, at: int | None = None) -> dict[str, Any]:
    """The numbers the paper states: heatmap range and mean of c at the index, and the layer trend."""
    at = run.at if at is None else check_at(run, at)
    grid = c_at(run, at)
    return {
        "run": run.label,
        "n": run.n,
        "sequences": int(run.meta.get("samples", 0)),
        "at": at,
        "c_min": float(grid.min()),
        "c_max": float(grid.max()),
        "c_mean": float(grid.mean()),
        "layer_rho": layer_trend(grid),
        "rank90": float(metric_grid(run, "rank90_mean").mean()),
    }


# ---------------------------------------------------------------- nonuniform k plan


def check_energy(energy: float) -> float:
    if not (isinstance(energy, (int, float)) and 0 < energy <= 1):
        raise SpectraError(f"--energy must be in (0, 1] (a share of the nuclear norm, e.g. 0.9), got {energy}")
    return float(energy)


def check_multiple(multiple: int) -> int:
    if multiple < 1:
        raise SpectraError(f"--multiple must be a positive integer (e.g. 8), got {multiple}")
    return int(multiple)


def smallest_index(cum: np.ndarray, energy: float) -> np.ndarray:
    """Smallest 1-based index j with cum[..., j-1] ≥ energy along the last axis (n where none does).

    c_n = 1 by definition, so falling back to n only absorbs round-off when energy is 1.
    """
    reached = np.asarray(cum) >= energy
    return np.where(reached.any(-1), reached.argmax(-1) + 1, reached.shape[-1])


def round_up(index: np.ndarray, multiple: int, n: int) -> np.ndarray:
    """Round up to a multiple of `multiple`, capped at n."""
    return np.minimum(-(-np.asarray(index) // multiple) * multiple, n)


@dataclass
class Plan:
    """The nonuniform projected dimension of every layer (and head) for energy E.

    `table` is tidy: one row per layer, or per (layer, head) when `per_head`, with the exact smallest
    index `k_min`, the rounded `k_proj` and the mean c reached at `k_proj`. A layer's k_proj is the one
    of its head-mean curve, or with `per_head` the largest of its heads' (so every head reaches E).
    """

    n: int
    heads: int
    energy: float
    multiple: int
    per_head: bool
    table: pd.DataFrame
    layer_k_proj: np.ndarray
    source: str

    @property
    def uniform_k_proj(self) -> int:
        """The one k a uniform Linformer needs for every layer and head to reach E: the largest k_proj."""
        return int(self.table["k_proj"].max())

    def costs(self) -> pd.DataFrame:
        """Attention cost Σ n·k_proj over every layer and head: this plan, uniform k_proj and full n·n.

        `plan_share` is the plan's cost over the row's cost; `saved` = 1 − plan_share.
        """
        heads = 1 if self.per_head else self.heads  # without --per-head every head of a layer shares k_proj
        planned = int(self.n * self.table["k_proj"].sum() * heads)
        units = int(self.layer_k_proj.size * self.heads)
        cost = [planned, units * self.n * self.uniform_k_proj, units * self.n * self.n]
        share = [planned / c for c in cost]
        return pd.DataFrame(
            {
                "attention": ["nonuniform (this plan)", f"uniform k_proj = {self.uniform_k_proj}", f"full (k_proj = n = {self.n})"],
                "cost": cost,
                "plan_share": share,
                "saved": [1 - x for x in share],
            }
        )

    def caption(self) -> str:
        """What the cost table compares, in one sentence."""
        per = "layer and head" if self.per_head else f"layer (× {self.heads} heads sharing its k_proj)"
        return (
            f"cost = Σ n·k_proj over every {per}: the multiply-adds of the n × k_proj scores and of their product "
            f"with the projected values, per unit of head dimension. plan_share = this plan's cost / the row's cost, "
            f"saved = 1 − plan_share, against a uniform Linformer needing k_proj = {self.uniform_k_proj} everywhere "
            f"to reach E = {self.energy:g}, and against full attention (n × n, n = {self.n})."
        )

    def by_layer(self) -> pd.DataFrame:
        """One row per layer for printing: its k_proj, and with `per_head` each head's k_proj as h0, h1, …"""
        if not self.per_head:
            return self.table
        wide = self.table.pivot(index="layer", columns="head", values="k_proj")
        wide.columns = [f"h{head}" for head in wide.columns]
        return wide.assign(k_proj=self.layer_k_proj).reset_index()[["layer", "k_proj", *wide.columns]]

    def to_json(self) -> dict[str, Any]:
        """A dict a Linformer module can consume: one k_proj per layer, optionally one per head."""
        layers = []
        for layer, k_layer in enumerate(self.layer_k_proj):
            entry: dict[str, Any] = {"layer": layer, "k_proj": int(k_layer)}
            if self.per_head:
                rows = self.table[self.table["layer"] == layer].sort_values("head")
                entry["heads"] = [int(x) for x in rows["k_proj"]]
            layers.append(entry)
        costs = self.costs().set_index("attention")["cost"]
        return {
            "n": self.n,
            "energy": self.energy,
            "multiple": self.multiple,
            "per_head": self.per_head,
            "criterion": "smallest index whose mean normalized cumulative singular value reaches energy, rounded up "
                         "to a multiple, capped at n" + ("; a layer's k_proj is the largest of its heads'" if self.per_head
                                                         else "; curve averaged over the layer's heads"),
            "source": self.source,
            "layers": layers,
            "uniform_k_proj": self.uniform_k_proj,
            "cost": {"nonuniform": int(costs.iloc[0]), "uniform": int(costs.iloc[1]), "full": int(costs.iloc[2])},
        }


def plan_k(run: Run, energy: float, *, multiple: int = 8, per_head: bool = False) -> Plan:
    """Smallest k_proj per layer (or per head) whose mean normalized cumulative singular value reaches `energy`."""
    energy, multiple = check_energy(energy), check_multiple(multiple)
    if per_head:
        curves = np.asarray(run.cum_mean, dtype=float)  # (layers, heads, n)
        layer, head = np.meshgrid(np.arange(run.layers), np.arange(run.heads), indexing="ij")
        ids = {"layer": layer.ravel(), "head": head.ravel()}
    else:
        curves = np.asarray(run.cum_mean, dtype=float).mean(axis=1)  # (layers, n)
        ids = {"layer": np.arange(run.layers)}
    k_min = smallest_index(curves, energy)
    k_proj = round_up(k_min, multiple, run.n)
    reached = np.take_along_axis(curves, (k_proj - 1)[..., None], axis=-1)[..., 0]
    table = pd.DataFrame({**ids, "k_min": k_min.ravel(), "k_proj": k_proj.ravel(), "c_at_k_proj": reached.ravel()})
    layer_k = k_proj.max(axis=1) if per_head else k_proj
    return Plan(run.n, run.heads, energy, multiple, per_head, table, np.asarray(layer_k), str(run.path))


# ---------------------------------------------------------------- comparing runs


def headlines(runs: list[Run], at: int | None = None) -> pd.DataFrame:
    """One row per run of its `headline` numbers, the run named by `unique_names`."""
    rows = [{**headline(run, at), "run": name} for name, run in zip(unique_names(runs), runs)]
    return pd.DataFrame(rows)


def unique_names(runs: list[Run]) -> list[str]:
    """Run labels (model · dataset), with n and then the directory name added where they collide."""
    names = [run.label for run in runs]
    if len(set(names)) < len(names):
        names = [f"{run.label} n={run.n}" for run in runs]
    if len(set(names)) < len(names):
        names = [f"{name} ({run.path.name})" for name, run in zip(names, runs)]
    return names


def compare(runs: list[Run], at: int | None = None) -> pd.DataFrame:
    """Tidy per-layer headline numbers of several runs: one row per (run, layer).

    `at` defaults to each run's stored index (n/4 unless analysed with another --at), so runs of different
    lengths compare at the same relative position; an explicit `at` must lie in 1…n for every run.
    """
    if not runs:
        raise SpectraError("give at least one run directory to compare")
    frames = []
    for name, run in zip(unique_names(runs), runs):
        index = run.at if at is None else check_at(run, at)
        frame = per_layer(run, index)
        frames.append(frame.assign(run=name, n=run.n, at=index)[["run", "n", "at", "layer", "c_at", "rank90", "rank99"]])
    return pd.concat(frames, ignore_index=True)


def run_keys(count: int) -> list[str]:
    """Short column keys A, B, C, … (R27, R28, … past 26) so side-by-side tables fit a terminal."""
    return [chr(ord("A") + i) if i < 26 else f"R{i + 1}" for i in range(count)]


def compare_wide(table: pd.DataFrame) -> pd.DataFrame:
    """The compare table side by side: one row per layer, `<key> c@<index>` and `<key> rank90` per run.

    Keys follow `run_keys` in the order runs appear in `table`.
    """
    columns: dict[str, pd.Series] = {}
    names = list(dict.fromkeys(table["run"]))
    for key, name in zip(run_keys(len(names)), names):
        rows = table[table["run"] == name].set_index("layer")
        at = int(rows["at"].iloc[0])
        columns[f"{key} c@{at}"] = rows["c_at"]
        columns[f"{key} rank90"] = rows["rank90"]
    wide = pd.DataFrame(columns)
    wide.index.name = "layer"
    return wide.reset_index()
