"""The read side of `spectra scaling`: its run object (`ScalingRun`), what it prints and its figures.

The views of a `spectra scaling` run: does the needed rank grow with n?

- `draw_scaling_ranks`: the rank holding 90% of P's nuclear norm against n on log–log axes, a line per layer
  (mean over heads, shallow to deep) and the pooled mean in black, with the references a rank independent of n
  (const), growing like log n (Theorem 1's O(log n)) and in proportion to n, all through the pooled value at
  the shortest n; the slope of a line is its exponent α;
- `draw_scaling_c`: c at fixed budgets k < n against n, one panel per k, and a last panel at k = n/4 (the
  paper's heatmap index): falling lines mean a fixed k captures less of P as sequences grow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..runs import FinishedRun, read_table
from .plots import style
from .analyze import Run
from .console import out, plural, print_frame
from .plots.style import DEPTH_CMAP, plain_log_ticks, plot_folder, pyplot
from .summaries import growth_reading, scaling_fixed, scaling_layers

@dataclass(repr=False)
class ScalingRun(FinishedRun):
    """A `spectra scaling` run loaded back: `table` (scaling.csv: per layer, head and n the ranks for 90%/99%, the
    effective rank, c at n/4), `c_fixed` (c at fixed budgets), `exponents` (growth of the ranks with n per head,
    layer and pooled, with intervals) and, with a target, `k_needed`; its analyze runs, by n, are `analyses` (also `runs()`)."""

    path: Path
    meta: dict[str, Any]
    table: pd.DataFrame
    c_fixed: pd.DataFrame
    exponents: pd.DataFrame
    k_needed: pd.DataFrame | None = None
    analyses: dict[int, Run] = field(default_factory=dict)


    @property
    def lengths(self) -> list[int]:
        return list(self.meta["lengths"])

    def runs(self) -> dict[int, Run]:
        """The analyze run at each n."""
        return self.analyses


def load(path: Path, meta: dict[str, Any], analyses: dict[int, Run]) -> ScalingRun:
    """A scaling run directory read back, with its analyze run at each n (`analyses`, read by the scaling kind
    through the registry: this read side reads run directories, not kinds)."""
    integers = {"layer": "Int64", "head": "Int64"}
    exponents = read_table(path, "exponents.csv", dtype={**integers, "method": str, "better": str})
    exponents[["method", "better"]] = exponents[["method", "better"]].fillna("")
    return ScalingRun(path, meta, read_table(path, "scaling.csv"), read_table(path, "c_fixed.csv"), exponents,
                      read_table(path, "k_needed.csv", optional=True, dtype={"layer": "Int64"}),
                      analyses)


def show(run: ScalingRun) -> None:
    """The rank for 90% per layer and n with its growth exponent, c at fixed k per n, what the pooled α says
    about the paper's claim, and with a target the k needed per n."""
    heads = run.meta["settings"]["extra"]
    where = "" if heads["heads"] == "all" and heads["layers"] == "all" else \
        f" (layers {heads['layers']}, heads {heads['heads']})"
    ranks = scaling_layers(run, "rank90")
    print_frame(ranks, f"{run.label}{where}, {plural(run.meta['samples'], 'sequence')} per n: rank holding 90% of "
                "P's nuclear norm, mean over heads; α fits rank ∝ n^α", {"α": 2, "n=": 1})
    blank = set(ranks["fits better"]) & {"tie", "n/a"}
    if blank:  # a column of ties (two lengths) would otherwise read as a missing result
        out.print("fits better: the power law or k = a + b·log n, whichever errs less in log k; "
                  + "; ".join(reason for name, reason in (
                      ("tie", "tie: both pass through every length (two lengths always do; three or more tell them "
                              "apart)"),
                      ("n/a", "n/a: a rank of 0 leaves both undefined")) if name in blank))
    print_frame(scaling_fixed(run), "c at a fixed k and at k = n/4 (mean over heads): steady across n when that k "
                "keeps up with longer sequences", missing="—")
    pooled = run.exponents[(run.exponents["scope"] == "pooled") & (run.exponents["method"] == "")].set_index("metric")
    for metric, share in (("rank90", "90%"), ("rank99", "99%")):
        row = pooled.loc[metric]
        out.print(f"rank for {share}: {growth_reading(row['alpha'], row['alpha_low'], row['alpha_high'])}")
    if run.k_needed is not None:
        pooled_k = run.k_needed[run.k_needed["layer"].isna()]
        wide = pooled_k.pivot(index="method", columns="n", values="k_needed")
        wide.columns = [f"n={n}" for n in wide.columns]
        fits = run.exponents[run.exponents["metric"] == "k_needed"].set_index("method")
        wide["α"] = fits["alpha"]
        print_frame(wide.reset_index(), f"smallest k (of those tried) whose mean head-output error over layers is ≤ "
                    f"{run.meta['target']}", {"n=": 0, "α": 2}, missing="—")


def _layer_colors(layers: int):
    plt = pyplot()
    cmap = plt.get_cmap(DEPTH_CMAP)
    return [cmap(i / max(1, layers - 1)) for i in range(layers)]


def _length_axis(ax, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_minor_formatter(lambda value, _: "")
    ax.set_xlabel("Sequence length n")
    ax.grid(alpha=0.25, linewidth=0.6, which="both")


def draw_scaling_ranks(run: ScalingRun, metric: str = "rank90"):
    """Rank for 90% (or `metric`) against n, log–log, a line per layer and the pooled mean, with references."""
    plt = pyplot()
    lengths = run.lengths
    table = run.table
    per_layer = table.groupby(["layer", "n"])[metric].mean().unstack("n").reindex(columns=lengths)
    pooled = table.groupby("n")[metric].mean().reindex(lengths).to_numpy()
    layers = int(run.meta["model"]["layers"])
    colors = _layer_colors(layers)
    figure, ax = plt.subplots(figsize=(7.6, 4.4), layout="constrained")
    for layer, values in per_layer.iterrows():
        ax.plot(lengths, values.to_numpy(), color=colors[int(layer)], linewidth=1.2, marker="o", markersize=3,
                label=f"layer {layer}", gid=f"layer:{layer}")
    fits = run.exponents[(run.exponents["metric"] == metric) & (run.exponents["scope"] == "pooled")
                         & (run.exponents["method"] == "")]
    alpha = float(fits["alpha"].iloc[0]) if len(fits) else float("nan")
    ax.plot(lengths, pooled, color="black", linewidth=2.2, marker="o", markersize=4,
            label=f"all heads (α = {alpha:.2f})", gid="pooled", zorder=5)
    n = np.array(lengths, dtype=float)
    start = pooled[0]
    references = (("const", np.full_like(n, start), ":"), ("∝ log n", start * np.log(n) / np.log(n[0]), "--"),
                  ("∝ n", start * n / n[0], "-."))
    for name, values, dash in references:
        ax.plot(n, values, color="0.45", linestyle=dash, linewidth=1.0, label=f"k {name}", gid=f"ref:{name}", zorder=1)
    ax.set_yscale("log")
    plain_log_ticks(ax)
    _length_axis(ax, lengths)
    share = metric.removeprefix("rank")
    ax.set_ylabel(f"Rank holding {share}% of ‖P‖* (mean over heads)")
    ax.set_title(f"Rank needed vs sequence length: slope = α in rank ∝ n^α\n{run.label}, "
                 f"{run.meta['samples']} sequences per n")
    # right of the axes: inside, upper left, it lay over the reference lines
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=7.5, ncol=2 if layers > 8 else 1, frameon=False)
    ax.set_gid("ranks")
    return figure


def draw_scaling_c(run: ScalingRun):
    """c at each fixed budget against n: a panel per budget, a line per layer and the pooled mean."""
    plt = pyplot()
    quarter = run.table[["layer", "head", "n", "c_quarter"]].rename(columns={"c_quarter": "c"}).assign(budget="n/4")
    fixed = pd.concat([run.c_fixed, quarter], ignore_index=True)
    counts = run.c_fixed.groupby("budget")["n"].nunique()
    budgets = [*sorted(counts[counts >= 2].index), "n/4"]  # a budget seen at one n has no trend to show
    layers = int(run.meta["model"]["layers"])
    colors = _layer_colors(layers)
    figure, axes = plt.subplots(1, len(budgets), figsize=(3.4 * len(budgets) + 0.6, 3.6), layout="constrained",
                                sharey=True, squeeze=False)
    for ax, budget in zip(axes[0], budgets):
        rows = fixed[fixed["budget"] == budget]
        for layer, values in rows.groupby("layer")[["n", "c"]]:
            means = values.groupby("n")["c"].mean()
            ax.plot(means.index, means.to_numpy(), color=colors[int(layer)], linewidth=1.1, marker="o", markersize=3,
                    gid=f"c:{budget}:layer:{layer}")
        pooled = rows.groupby("n")["c"].mean()
        ax.plot(pooled.index, pooled.to_numpy(), color="black", linewidth=2.0, marker="o", markersize=4,
                gid=f"c:{budget}:pooled", zorder=5)
        _length_axis(ax, sorted(rows["n"].unique()))
        ax.set_title(f"k = {budget}")
    axes[0][0].set_ylabel("c at k (normalized cumulative σ)")
    bar = figure.colorbar(plt.cm.ScalarMappable(norm=plt.Normalize(-0.5, layers - 0.5), cmap=DEPTH_CMAP),
                          ax=axes[0].tolist(), fraction=0.04, pad=0.02)
    bar.set_label("Layer (black: all heads)")
    figure.suptitle(f"Share of P a fixed k captures as n grows — {run.label}", fontsize=10.5)
    return figure


def plot_scaling(run: ScalingRun, out: str | Path | None = None) -> list[Path]:
    """Write the views of a scaling run into directory `out` (default <run directory>/figures): rank vs n
    and c at fixed k vs n. Returns the paths."""
    folder = plot_folder(run, out)
    return style.save(draw_scaling_ranks(run), folder / "rank_vs_n") + style.save(draw_scaling_c(run),
                                                                                   folder / "c_fixed_vs_n")


def plot(run: ScalingRun, out: str | Path | None = None) -> list[Path]:
    return plot_scaling(run, out)
