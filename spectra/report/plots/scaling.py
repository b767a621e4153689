"""The views of a `spectra scaling` run: does the needed rank grow with n?

- `draw_scaling_ranks`: the rank holding 90% of P's nuclear norm against n on log–log axes, a line per layer
  (mean over heads, shallow to deep) and the pooled mean in black, with the references a rank independent of n
  (const), growing like log n (Theorem 1's O(log n)) and in proportion to n, all through the pooled value at
  the shortest n; the slope of a line is its exponent α;
- `draw_scaling_c`: c at fixed budgets k < n against n, one panel per k, and a last panel at k = n/4 (the
  paper's heatmap index): falling lines mean a fixed k captures less of P as sequences grow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...runs import ScalingRun
from . import style
from .spectra import DEPTH_CMAP
from .style import plain_log_ticks, plot_folder, pyplot


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
