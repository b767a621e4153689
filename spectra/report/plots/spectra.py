"""Per-run views of an analyze run: the mean curve of every layer, the heatmap of c at an index, the heatmaps
of the rank needed for 90% and 99% of the nuclear norm, of the sink mass and the attention entropy, and
(when measured) the key rank per layer before and after RoPE, for 90% of the keys' variance (centred) and of
their energy (uncentred, over the run and per sequence).

Gids the tests read back: "curves" (lines "layer:<i>"), "heatmap", "rank90", "rank99", "sink", "entropy",
"key_ranks" (lines "<stage>:<column>").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...config import layers_label
from ...runs import Run
from .. import summaries
from . import (
    style,  # style.save, looked up at call time: the one name tests patch to record figures
)
from .style import draw_heatmap, index_ticks, plot_folder, pyplot, subtitle, ticks

DEPTH_CMAP = "viridis"


def heatmap_size(layers: int, heads: int) -> tuple[float, float]:
    """Inches for one heatmap with its colour bar: cells shrink past 12 rows or columns."""
    width = 1.8 + 0.42 * min(max(heads, 6), 12) + 0.26 * max(heads - 12, 0)
    height = 1.4 + 0.3 * min(max(layers, 8), 12) + 0.17 * max(layers - 12, 0)
    return width, height


def annotate_digits(values: np.ndarray, spread: bool) -> int | None:
    """Decimals of the cell labels (2 for spread values like c, 0 for ranks), or None where they would not fit:
    more than 12 heads or 24 layers."""
    layers, heads = values.shape
    if heads > 12 or layers > 24:
        return None
    return 2 if spread else 0


def draw_layer_curves(run: Run):
    """A line per layer (mean over heads), coloured from shallow to deep, with a layer colour bar."""
    plt = pyplot()
    from matplotlib.colors import BoundaryNorm

    figure, ax = plt.subplots(figsize=(6.2, 4.2), layout="constrained")
    cmap = plt.get_cmap(DEPTH_CMAP)
    norm = BoundaryNorm(np.arange(run.layers + 1) - 0.5, cmap.N)
    index = np.arange(1, run.n + 1)
    curves = summaries.head_mean(run.cum_mean)
    for layer, curve in enumerate(curves):
        if np.isnan(curve).all():
            continue  # not measured (--layers)
        ax.plot(index, curve, color=cmap(norm(layer)), linewidth=1.4, label=f"layer {layer}", gid=f"layer:{layer}")
    ax.set_xlim(0, run.n)
    ax.set_xticks(index_ticks(run.n))
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    ax.set_ylim(top=1.005)
    ax.set_xlabel("Singular value index")
    ax.set_ylabel("Normalized cumulative singular value")
    heads = run.meta.get("heads")
    over = f"{run.heads} heads" if heads is None else f"heads {layers_label(heads)}"
    ax.set_title(f"Mean over {over} per layer\n{subtitle(run, run.n)}")
    ax.grid(alpha=0.25, linewidth=0.6)
    bar = figure.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, fraction=0.05, pad=0.02)
    bar.set_ticks(ticks(run.layers, most=12))
    bar.set_label("Layer index (0 = lowest)")
    ax.set_gid("curves")
    return figure


def draw_c_heatmap(run: Run, at: int | None = None):
    """Heatmap of the mean normalized cumulative value at index `at` (default the run's stored index)."""
    plt = pyplot()
    at = run.at if at is None else summaries.check_at(run, at)
    values = summaries.c_at(run, at)
    figure, ax = plt.subplots(figsize=heatmap_size(run.layers, run.heads), layout="constrained")
    draw_heatmap(ax, values, title=f"Normalized cumulative value at index {at}\n{subtitle(run, run.n)}",
                 colorbar=f"c at index {at}", digits=annotate_digits(values, spread=True))
    return figure


def draw_rank_heatmaps(run: Run):
    """Side-by-side heatmaps of the mean number of singular values needed for 90% and 99% of the nuclear norm."""
    plt = pyplot()
    width, height = heatmap_size(run.layers, run.heads)
    figure, axes = plt.subplots(1, 2, figsize=(2 * width, height + 0.3), layout="constrained")
    for ax, energy in zip(axes, (90, 99)):
        values = summaries.metric_grid(run, f"rank{energy}_mean")
        draw_heatmap(ax, values, title=f"Rank needed for {energy}%", colorbar="Number of singular values (mean over sequences)",
                     digits=annotate_digits(values, spread=False))
        ax.set_gid(f"rank{energy}")
    figure.suptitle(subtitle(run, run.n))
    return figure


def draw_attention_heatmaps(run: Run):
    """Side by side: the mean sink mass (attention of queries to the first token) and the mean row entropy."""
    plt = pyplot()
    width, height = heatmap_size(run.layers, run.heads)
    figure, axes = plt.subplots(1, 2, figsize=(2 * width, height + 0.3), layout="constrained")
    panels = (("sink", "Sink mass: attention to the first token", "Share of a query's attention (mean)"),
              ("entropy", "Attention entropy", "Nats per query (mean)"))
    for ax, (name, title, label) in zip(axes, panels):
        values = summaries.metric_grid(run, f"{name}_mean")
        draw_heatmap(ax, values, title=title, colorbar=label, digits=annotate_digits(values, spread=True))
        ax.set_gid(name)
    figure.suptitle(subtitle(run, run.n))
    return figure


KEY_STAGES = {"projection": ("before RoPE (W^K output)", "-"), "attention": ("after RoPE (what attention sees)", "--")}

#: qkv.csv's key-rank columns the view draws: colour and what each is. Two conventions: the energy Σkᵀk (uncentred:
#: the mean key counts, often one direction holding most of it) and the variance (centred: the mean removed,
#: the covariance's eigenvalues — what a PCA basis such as Loki's must keep, several times larger)
KEY_RANKS = {
    "pca_rank90": ("tab:green", "over the run, 90% of the variance (centred: pca_rank90)"),
    "dataset_rank90": ("tab:blue", "over the run, 90% of the energy Σkᵀk (uncentred: dataset_rank90)"),
    "rank90_mean": ("tab:orange", "per sequence, 90% of the energy (uncentred: rank90_mean)"),
}


def draw_key_ranks(run: Run):
    """Per layer (mean over key/value heads): the keys' rank for 90% of their variance over the run (centred), for
    90% of their energy over the run and per sequence (uncentred), before and after RoPE, against the head dimension."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    figure, ax = plt.subplots(figsize=(6.4, 4.9), layout="constrained")
    d = int(run.qkv["d"].iloc[0])
    handles, labels, stages = [], [], set()
    for column, (color, what) in KEY_RANKS.items():
        if column not in run.qkv.columns:  # a run from before the centred ranks
            continue
        ranks = summaries.key_ranks(run, "k", column)
        for stage, (where, linestyle) in KEY_STAGES.items():
            if stage in ranks.columns:
                ax.plot(ranks["layer"], ranks[stage], color=color, linestyle=linestyle, marker="o", markersize=4,
                        label=f"{what}, {where}", gid=f"{stage}:{column}")
                stages.add(stage)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4))
        labels.append(what)
    ax.axhline(d, color="0.5", linewidth=0.8, linestyle=":")
    handles.append(Line2D([], [], color="0.5", linewidth=0.8, linestyle=":"))
    labels.append(f"head dimension d = {d}")
    for stage, (where, linestyle) in KEY_STAGES.items():  # colour says what (first column), line style where
        if stage in stages:
            handles.append(Line2D([], [], color="0.3", linestyle=linestyle))
            labels.append(where)
    ax.set_xticks(ticks(run.layers) if run.layers > 16 else np.arange(run.layers))
    ax.set_ylim(0, d * 1.08)
    ax.set_xlabel("Layer index")
    ax.set_ylabel("Key rank (mean over key/value heads)")
    ax.grid(alpha=0.25, linewidth=0.6)
    ax.set_title(f"Rank of the keys per layer\n{subtitle(run, run.n)}")
    # below the axes, so it never covers a curve (inside, it hid the low layers' ranks); one column: long labels
    figure.legend(handles, labels, loc="outside lower center", ncols=1, frameon=False, fontsize=8)
    ax.set_gid("key_ranks")
    return figure


@dataclass
class RunPlots:
    """Paths written by `plot_run`, by view (empty where the run has no such measurement)."""

    curves: list[Path]
    heatmap: list[Path]
    rank: list[Path]
    attention: list[Path] = field(default_factory=list)
    keys: list[Path] = field(default_factory=list)

    @property
    def paths(self) -> list[Path]:
        return [*self.curves, *self.heatmap, *self.rank, *self.attention, *self.keys]


def plot_run(run: Run, out: str | Path | None = None, *, at: int | None = None) -> RunPlots:
    """Write the per-run views (layer curves, c heatmap at `at`, rank heatmaps, sink and entropy heatmaps, key
    ranks per layer when measured) into directory `out` (default <run directory>/figures)."""
    at = run.at if at is None else summaries.check_at(run, at)
    folder = plot_folder(run, out)
    return RunPlots(
        curves=style.save(draw_layer_curves(run), folder / "curves"),
        heatmap=style.save(draw_c_heatmap(run, at), folder / f"c_at{at}"),
        rank=style.save(draw_rank_heatmaps(run), folder / "rank"),
        attention=style.save(draw_attention_heatmaps(run), folder / "sink_entropy")
        if "sink_mean" in run.metrics.columns else [],
        keys=style.save(draw_key_ranks(run), folder / "key_ranks") if run.qkv is not None else [],
    )
