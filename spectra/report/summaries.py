"""Numbers that follow from finished runs and are shown both in the terminal and in figures.

Pure numpy/pandas on run objects, so a table and a figure of the same run always agree:

- analyze runs: c at an index, metric grids, the layer trend, per-layer and headline numbers, comparisons;
- approx runs: the error per (method, budget);
- theorems runs: the pooled errors of every method per k;
- scaling runs: a metric per layer and n beside its growth exponent, c at fixed budgets per n.
"""

from __future__ import annotations

import math

from typing import Any

import numpy as np
import pandas as pd

from ..errors import SpectraError
from ..runs import FinishedRun

# ---------------------------------------------------------------- one analyze run


def default_at(n: int) -> int:
    """The paper's heatmap index n/4 (128 for n = 512), at least 1."""
    return max(1, n // 4)


def check_at(run: FinishedRun, at: int) -> int:
    """`at` if it is a 1-based index of the run's curves, else a one-line SpectraError."""
    if not 1 <= at <= run.n:
        raise SpectraError(f"--at must be an index in 1…{run.n} (the sequence length of {run.path}), got {at}")
    return at


def c_at(run: FinishedRun, at: int | None = None) -> np.ndarray:
    """Mean normalized cumulative singular value at 1-based index `at`, shape (layers, heads).

    For the run's stored `at` this is the metrics table's c_at_mean; for any other index it is the mean
    curve cum_mean at that grid index (the same quantity: both average c over sequences).
    """
    at = run.at if at is None else check_at(run, at)
    if at == run.at:
        return metric_grid(run, "c_at_mean")
    return np.asarray(run.cum_mean[:, :, at - 1], dtype=float)


def metric_grid(run: FinishedRun, column: str) -> np.ndarray:
    """A metrics column (e.g. rank90_mean) as a (layers, heads) array, layer down and head across; NaN for the
    (layer, head) a run with --layers/--heads did not measure."""
    if column not in run.metrics.columns:
        raise SpectraError(f"{run.path} has no metric '{column}'; its metrics are {', '.join(run.metrics.columns)}")
    grid = np.full((run.layers, run.heads), np.nan)
    grid[run.metrics["layer"].to_numpy(), run.metrics["head"].to_numpy()] = run.metrics[column].to_numpy(float)
    return grid


def layer_trend(values: np.ndarray) -> float:
    """Spearman rank correlation between layer index and the per-layer mean of `values` (layers, heads).

    Positive when higher layers have a larger c at the index, i.e. are more skewed (lower rank), as the
    paper states; NaN when there are fewer than two layers or the means are constant.
    """
    from scipy.stats import spearmanr

    values = np.asarray(values, dtype=float)
    means = values[~np.isnan(values).all(axis=1)].mean(axis=1)
    if means.size < 2 or np.ptp(means) == 0:
        return float("nan")
    return float(spearmanr(np.arange(means.size), means).statistic)


def head_mean(values: np.ndarray) -> np.ndarray:
    """Mean over the heads axis (1) of the measured heads; NaN for a layer none of whose heads was measured
    (runs with --layers/--heads)."""
    values = np.asarray(values, dtype=float)
    measured = ~np.isnan(values)
    total = np.where(measured, values, 0.0).sum(axis=1)
    count = measured.sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def per_layer(run: FinishedRun, at: int | None = None) -> pd.DataFrame:
    """One row per layer: mean over heads of c at the index and of the ranks needed for 90% and 99%."""
    at = run.at if at is None else check_at(run, at)
    return pd.DataFrame(
        {
            "layer": np.arange(run.layers),
            "c_at": head_mean(c_at(run, at)),
            "rank90": head_mean(metric_grid(run, "rank90_mean")),
            "rank99": head_mean(metric_grid(run, "rank99_mean")),
        }
    )


def key_ranks(run: FinishedRun, tensor: str = "k", column: str = "dataset_rank90") -> pd.DataFrame:
    """Per layer, the mean over heads of a query/key/value rank `column`, one column per stage (projection:
    before RoPE; attention: what attention sees); empty when the run has no qkv table."""
    if run.qkv is None:
        return pd.DataFrame({"layer": np.arange(run.layers)})
    rows = run.qkv[run.qkv["tensor"] == tensor]
    wide = rows.groupby(["layer", "stage"])[column].mean().unstack("stage")
    return wide.reset_index().rename_axis(columns=None)


def analyze_layers(run: FinishedRun) -> pd.DataFrame:
    """What the terminal shows of an analyze run, per layer (means over heads): c at the run's index, the rank
    for 90% of the nuclear norm, sink mass and entropy when measured, and the dataset-level key rank for 90%
    of the energy Σkᵀk (uncentred: `dataset_rank90`) before and after RoPE when measured (a model without RoPE has one
    key stage: its column says neither)."""
    columns = {"c_at_mean": f"c@{run.at}", "rank90_mean": "rank for 90%", "sink_mean": "sink", "entropy_mean": "entropy"}
    present = [column for column in columns if column in run.metrics.columns]
    table = run.metrics.groupby("layer")[present].mean().reset_index().rename(columns=columns)
    keys = key_ranks(run)
    rotated = "projection" in keys.columns  # a model with RoPE: the keys measured before it and after it
    for stage, name in (("projection", "key rank90 (energy) pre-RoPE"),
                        ("attention", "key rank90 (energy) post-RoPE" if rotated else "key rank90 (energy)")):
        if stage in keys.columns:
            table[name] = keys[stage].to_numpy()
    return table


def headline(run: FinishedRun, at: int | None = None) -> dict[str, Any]:
    """The numbers the paper states: heatmap range and mean of c at the index, and the layer trend."""
    at = run.at if at is None else check_at(run, at)
    grid = c_at(run, at)
    return {
        "run": run.label,
        "n": run.n,
        "sequences": int(run.meta.get("samples", 0)),
        "at": at,
        "c_min": float(np.nanmin(grid)),
        "c_max": float(np.nanmax(grid)),
        "c_mean": float(np.nanmean(grid)),
        "layer_rho": layer_trend(grid),
        "rank90": float(np.nanmean(metric_grid(run, "rank90_mean"))),
    }


def band(run: FinishedRun, quantile: float = 0.1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean curve over all layer×head mean curves and its `quantile`–(1 − quantile) band, each of length n."""
    curves = np.asarray(run.cum_mean, dtype=float).reshape(run.layers * run.heads, run.n)
    curves = curves[~np.isnan(curves).any(axis=1)]
    low, high = np.quantile(curves, [quantile, 1 - quantile], axis=0)
    return curves.mean(axis=0), low, high


# ---------------------------------------------------------------- several analyze runs


def unique_names(runs: list[FinishedRun]) -> list[str]:
    """Run labels (model · dataset), with n and then the directory name added where they collide."""
    names = [run.label for run in runs]
    if len(set(names)) < len(names):
        names = [f"{run.label} n={run.n}" for run in runs]
    if len(set(names)) < len(names):
        names = [f"{name} ({run.path.name})" for name, run in zip(names, runs)]
    return names


def headlines(runs: list[FinishedRun], at: int | None = None) -> pd.DataFrame:
    """One row per run of its `headline` numbers, the run named by `unique_names`."""
    rows = [{**headline(run, at), "run": name} for name, run in zip(unique_names(runs), runs)]
    return pd.DataFrame(rows)


def compare(runs: list[FinishedRun], at: int | None = None) -> pd.DataFrame:
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


# ---------------------------------------------------------------- approx and theorems runs


def labels_in_order(frame: pd.DataFrame, column: str = "method") -> list[str]:
    """The distinct values of `column` in order of first appearance (the runs' method order, kept in legends
    and table columns)."""
    return list(dict.fromkeys(frame[column]))


def approx_by_budget(run: FinishedRun, metric: str = "out_err") -> pd.DataFrame:
    """Mean over layers of the per-layer mean over heads: one row per (method, budget)."""
    per_layer = run.per_layer(metric)
    return per_layer.groupby(["method", "budget"], sort=False)[metric].mean().reset_index()


def theorem1_rows(run: FinishedRun, relative_to: str = "output", table: str = "theorem1") -> pd.DataFrame:
    """Theorem 1's rows in one form: "output" (the statement, relative to ‖Pw‖) or "rows" (the proof's, each
    entry against ε‖P_i‖‖w‖; jl only). Runs from before the proof form have the statement's rows only."""
    one = run.tables[table]
    if "relative_to" not in one.columns:
        return one if relative_to == "output" else one.iloc[0:0]
    return one[one["relative_to"] == relative_to]


def theorem1_draws(run: FinishedRun) -> tuple[int, str]:
    """The independent draws of R behind one pooled Theorem 1 rate (one budget), and what they are made of.

    R is drawn per (layer, budget, sequence, draw) and shared by the heads and columns w of its layer, so the
    layers × sequences × draws rates are independent given the data, and the heads and columns within one R are
    not; with a fixed projection (draws 0, or a run from before per-sequence draws) there is one R per (layer,
    budget) for the whole run."""
    one = run.tables["theorem1"]
    layers = run.tables["theorem1_layers"]["layer"].nunique() if "theorem1_layers" in run.tables else 1
    per = int(one["draws"].iloc[0]) if "draws" in one.columns else 0
    if not per:
        return layers, f"one R per layer: {layers} layers"
    sequences = int(one["sequences"].iloc[0]) if "sequences" in one.columns else int(run.meta.get("samples", 1))
    return layers * sequences * per, f"{layers} layers × {sequences} sequences × {per} per sequence"


def theorem_errors(run: FinishedRun, relative_to: str = "output") -> pd.DataFrame:
    """Pooled errors per (label, budget): jl, svd (Theorem 1, per column w of V), linformer(<sharing>) and
    theorem2(<variant>) (Theorem 2, per row w, relative to ‖softmax(w)V‖ or, with "rhs", its right side);
    columns label, budget, median, p95, mean, max."""
    one, two = theorem1_rows(run, "output"), run.tables["theorem2"]
    arch = two[two["method"] == "linformer"]
    delta = two[(two["method"] == "theorem2") & (two["relative_to"] == relative_to)]
    parts = [one.assign(label=one["method"]),
             arch.assign(label="linformer(" + arch["variant"] + ")"),
             delta.assign(label="theorem2(" + delta["variant"] + ")")]
    columns = ["label", "budget", "median", "p95", "mean", "max"]
    return pd.concat(parts).drop_duplicates(["label", "budget"])[columns].reset_index(drop=True)


def theorem_n(run: FinishedRun) -> int:
    """The sequence length n of a theorems run (as its pooled Theorem 1 table records it)."""
    return int(run.tables["theorem1"]["n"].iloc[0])


def gap_closed(run: FinishedRun, table: str = "head_stats") -> pd.DataFrame:
    """Per (method, budget, layer): the method's mean head-output error, the random baseline's and the oracle's,
    and the fraction of the gap between them the method closes, (random − method) / (random − svd): 0 is no
    better than a random projection, 1 is as good as the best rank-k matrix. The random baseline of a
    Linformer variant is the random Linformer of the same sharing level when the run has it, else jl."""
    layers = run.per_layer("out_err", table=table)
    errors = layers.set_index(["method", "budget", "layer"])["out_err"]
    methods = labels_in_order(layers)
    columns = ["method", "budget", "layer", "out_err", "random", "random_method", "oracle", "gap_closed"]
    if "svd" not in methods:
        return pd.DataFrame(columns=columns)
    rows = []
    for (method, budget, layer), error in errors.items():
        sharing = method[method.index("("):] if "(" in method else ""
        random = next((name for name in (f"linformer{sharing}", "jl") if name in methods and sharing), None)
        random = random or ("jl" if "jl" in methods else None)
        if random is None or method in ("svd", random):
            continue
        low, high = errors[("svd", budget, layer)], errors[(random, budget, layer)]
        rows.append({"method": method, "budget": budget, "layer": layer, "out_err": error, "random": high,
                     "random_method": random, "oracle": low,
                     "gap_closed": (high - error) / (high - low) if high != low else np.nan})
    return pd.DataFrame(rows, columns=columns)  # the columns also when no method has a random baseline


# ---------------------------------------------------------------- scaling runs


def scaling_layers(run: FinishedRun, metric: str = "rank90") -> pd.DataFrame:
    """One row per layer and a last row 'all' (every measured head): the mean over heads of `metric` at each n
    (columns 'n=64', …), then the growth exponent α of the power-law fit, its 95% interval and the model that
    fits better (power or log)."""
    table = run.table
    wide = table.groupby(["layer", "n"])[metric].mean().unstack("n")
    wide.loc["all"] = table.groupby("n")[metric].mean()
    wide.columns = [f"n={n}" for n in wide.columns]
    fits = run.exponents[(run.exponents["metric"] == metric) & (run.exponents["scope"] != "head")]
    keys = ["all" if scope == "pooled" else int(layer) for scope, layer in zip(fits["scope"], fits["layer"])]
    fits = fits.assign(key=keys).set_index("key")
    wide["α"] = fits["alpha"]
    wide["95% interval"] = [f"[{', '.join(interval_digits(low, high))}]" if np.isfinite(low) else "" for low, high in
                            zip(fits["alpha_low"].reindex(wide.index), fits["alpha_high"].reindex(wide.index))]
    wide["fits better"] = [fits_better(fits.loc[key]) if key in fits.index else "" for key in wide.index]
    return wide.rename_axis("layer").reset_index()


def fits_better(fit: pd.Series) -> str:
    """The model that fits better ("power" or "log", exponents.csv's `better`), or why neither does: "tie" where
    both fit every length exactly (two lengths always do: each model has two parameters), "n/a" where a fit is
    undefined (a mean rank of 0)."""
    if fit["better"]:
        return str(fit["better"])
    exact = np.isfinite(fit["rmse_power"]) and fit["rmse_power"] == fit["rmse_log"]
    return "tie" if exact or fit["lengths"] <= 2 else "n/a"


def scaling_fixed(run: FinishedRun) -> pd.DataFrame:
    """c at each fixed budget (rows) and n (columns), the mean over every measured head, and a last row at
    k = n/4 (the paper's heatmap index): constant across n when a fixed k keeps up with longer sequences."""
    wide = run.c_fixed.groupby(["budget", "n"])["c"].mean().unstack("n").reindex(columns=run.lengths)
    wide.index = wide.index.astype(str)
    wide.loc["n/4"] = run.table.groupby("n")["c_quarter"].mean().reindex(run.lengths)
    wide.columns = [f"n={n}" for n in wide.columns]
    return wide.rename_axis("k").reset_index()


def interval_digits(low: float, high: float, most: int = 4) -> tuple[str, str]:
    """The ends of an interval with two decimals, or as many more (up to `most`) as it takes for them to differ:
    a narrow interval is never printed as 0.98–0.98, which reads as no uncertainty at all. Ends that are equal
    (every example scored alike, so the bootstrap has nothing to vary) keep two decimals: 0.00–0.00, not
    0.0000–0.0000."""
    digits = 2
    while digits < most and low != high and f"{low:.{digits}f}" == f"{high:.{digits}f}":
        digits += 1
    return f"{low:.{digits}f}", f"{high:.{digits}f}"


#: what a fitted growth exponent α of the needed k (k ∝ n^α) reads as: (upper end of its range, verdict, short name)
GROWTH_READINGS = ((0.1, "the needed k does not measurably grow with n, as the paper claims", "no growth"),
                   (0.9, "the needed k grows with n, but slower than n: low rank, though not independent of n",
                    "growth slower than n"),
                   (math.inf, "the needed k grows in proportion to n: no fixed k keeps up with longer sequences",
                    "growth in proportion to n"))


def growth_reading(alpha: float, low: float, high: float) -> str:
    """What an exponent α says about the needed k, following its interval: the one reading (`GROWTH_READINGS`) the
    interval lies in, or "undetermined" naming the readings it spans; without an interval, the reading of α."""
    if not np.isfinite(alpha):
        return "no exponent (fewer than two lengths with positive values)"
    bounded = np.isfinite(low) and np.isfinite(high)
    interval = " (95% interval {}–{})".format(*interval_digits(low, high)) if bounded else ""
    low, high = (low, high) if bounded else (alpha, alpha)
    lower = [-math.inf] + [upper for upper, _, _ in GROWTH_READINGS[:-1]]
    met = [reading for start, reading in zip(lower, GROWTH_READINGS) if low < reading[0] and high >= start]
    if len(met) == 1:
        return f"α = {alpha:.2f}{interval}: {met[0][1]}"
    spans = "every reading from" if len(met) > 2 else "both"
    return (f"α = {alpha:.2f}{interval}: undetermined: the interval holds {spans} {met[0][2]} "
            f"{'to' if len(met) > 2 else 'and'} {met[-1][2]}; more sequences per length narrow it")
