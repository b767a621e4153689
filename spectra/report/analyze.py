"""The read side of `spectra analyze`: its run object (`Run`), what `spectra analyze RUN` prints (and `plan-k` and
`compare`, which read analyze runs), and its figures.

Per-run views of an analyze run: the mean curve of every layer, the heatmap of c at an index, the heatmaps
of the rank needed for 90% and 99% of the nuclear norm, of the sink mass and the attention entropy, and
(when measured) the key rank per layer before and after RoPE, for 90% of the keys' variance (centred) and of
their energy (uncentred, over the run and per sequence).

Gids the tests read back: "curves" (lines "layer:<i>"), "heatmap", "rank90", "rank99", "sink", "entropy",
"key_ranks" (lines "<stage>:<column>").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import layers_label
from ..runs import FinishedRun, read_arrays, read_table
from ..timings import summary
from . import summaries
from .published import SUFFIX, verified
from .console import out, plural, print_frame
from .plan import Plan
from .plots import (
    style,  # style.save, looked up at call time: the one name tests patch to record figures
)
from .plots.style import DEPTH_CMAP, draw_heatmap, index_ticks, plot_folder, pyplot, subtitle, ticks
from .summaries import analyze_layers, compare_wide, headlines, run_keys

if TYPE_CHECKING:  # pandas is imported where a table is read: the command line's start does not pay for it
    import pandas as pd


@dataclass(repr=False)
class Run(FinishedRun):
    """An `analyze` run loaded back: metadata, the per-(layer, head) table and the curves.

    Curves are arrays indexed (layer, head, index) with index j = 1…n on the relative grid j/n:
    `cum_mean`/`cum_std` the normalized cumulative singular value, `sigma_mean`/`sigma_std` the
    singular values at absolute index (zero past a sequence's length). `qkv`: the query/key/value spectra
    table (one row per tensor, stage, layer, head) when the run measured them, else None.
    """

    path: Path
    meta: dict[str, Any]
    metrics: pd.DataFrame
    cum_mean: np.ndarray
    cum_std: np.ndarray
    sigma_mean: np.ndarray
    sigma_std: np.ndarray
    qkv: pd.DataFrame | None = None

    @property
    def causal(self) -> bool:
        """Whether the model is a decoder (its P is lower triangular)."""
        return bool(self.meta["model"].get("causal", False))

    @property
    def layers(self) -> int:
        return self.cum_mean.shape[0]

    @property
    def heads(self) -> int:
        return self.cum_mean.shape[1]

    @property
    def n(self) -> int:
        return self.cum_mean.shape[2]

    @property
    def at(self) -> int:
        return int(self.meta["at"])

    @property
    def label(self) -> str:
        """model · data, and the mode when it is not the paper's pack mode."""
        mode = self.meta["data"].get("mode", "pack")
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}" + ("" if mode == "pack" else f" ({mode})")

    def curves(self) -> pd.DataFrame:
        """The curves as a tidy frame: one row per (layer, head, index)."""
        import pandas as pd

        layer, head, index = np.meshgrid(
            np.arange(self.layers), np.arange(self.heads), np.arange(1, self.n + 1), indexing="ij"
        )
        return pd.DataFrame(
            {
                "layer": layer.ravel(),
                "head": head.ravel(),
                "index": index.ravel(),
                "cum_mean": self.cum_mean.ravel(),
                "cum_std": self.cum_std.ravel(),
                "sigma_mean": self.sigma_mean.ravel(),
                "sigma_std": self.sigma_std.ravel(),
            }
        )


@dataclass(repr=False)
class Tables(FinishedRun):
    """An analyze run's published folder read back (`report.published`): its per-head tables — `metrics`
    (metrics.csv) and `qkv` (qkv.csv, None where the run did not measure the keys) — without the curves, which
    stay in the run directory. What the bridge and a headbudget's weights read; `kinds.base.load_run` refuses it
    where the curves are needed."""

    path: Path
    meta: dict[str, Any]
    metrics: pd.DataFrame
    qkv: pd.DataFrame | None = None


def load(path: Path, meta: dict[str, Any]) -> Run | Tables:
    """An analyze run directory read back, or its published folder as `Tables` (each file's sha256 checked first)."""
    if verified(path, meta):
        return Tables(path, meta, read_table(path, "metrics.csv" + SUFFIX),
                      read_table(path, "qkv.csv" + SUFFIX, optional=True))
    curves = read_arrays(path / "curves.npz")
    qkv = read_table(path, "qkv.csv", optional=True)
    return Run(path, meta, read_table(path, "metrics.csv"), curves["cum_mean"], curves["cum_std"],
               curves["sigma_mean"], curves["sigma_std"], qkv)


#: what the key-rank columns of the analyze table are: the energy rank, not the variance one (issue 33, item 7)
KEY_RANK_NOTE = ("key rank90 (energy): dimensions of the head holding 90% of the keys' energy Σkᵀk over the run, "
                 "the mean key included (dataset_rank90 in qkv.csv; pca_rank90 there holds 90% of their variance, "
                 "the mean removed)")


def columns_note(run: Run) -> str:
    """What the per-layer table's columns mean (the table printed c@32 and "rank for 90%" without a word: issue 41,
    item 15), naming only the columns it has."""
    table = run.metrics.columns
    parts = [f"c@{run.at}: the share of P's nuclear norm (the sum of its singular values) that its {run.at} largest "
             "singular values hold", "rank for 90%: the fewest singular values holding 90% of it (both per sequence "
             "and head, then averaged)"]
    if "sink_mean" in table:
        parts.append("sink: mean attention of queries to the first token")
    if "entropy_mean" in table:
        parts.append("entropy: of a query's attention, in nats")
    if run.qkv is not None:
        parts.append(KEY_RANK_NOTE)
    return "; ".join(parts)


def show(run: Run) -> None:
    """The per-layer summary of an analyze run and where its time went (the command line says where it is)."""
    model = "decoder, causal P" if run.causal else "encoder"
    heads = run.meta.get("heads")
    over = f"{run.heads} heads" if heads is None else f"heads {layers_label(heads)}"
    print_frame(analyze_layers(run), f"{run.label} ({model}): n = {run.n}, {plural(run.meta['samples'], 'sequence')}, "
                f"mean over {over} per layer", {"rank": 1, "entropy": 2})
    out.print(columns_note(run))
    if summary(run.meta.get("timings")):  # where the time went (spectra.timings)
        out.print(summary(run.meta["timings"]))


def print_plan(run: Run, plan: Plan) -> None:
    """A k plan per layer (or head) and its cost against uniform and full attention."""
    rule = "the largest of its heads' budget" if plan.per_head else f"from the mean curve of its {run.heads} heads"
    print_frame(plan.by_layer(), f"{run.label}, n = {run.n}: smallest budget whose mean normalized cumulative "
                f"singular value reaches E = {plan.energy:g}, rounded up to a multiple of {plan.multiple} "
                f"(a layer's budget: {rule})")
    print_frame(plan.costs(), "Attention " + plan.caption(), {"plan_share": -1, "saved": -1})
    out.print(RANK_VS_PLAN)


#: why plan-k's k_min is not analyze's rank90 (the README says the same, tests/report/test_plan.py checks it)
RANK_VS_PLAN = ("k_min is not analyze's rank90: rank90 is the mean over sequences of each sequence's own smallest k "
                "reaching 90%, k_min the smallest k where the mean curve (over sequences, and heads unless --per-head) "
                "reaches E; neither bounds the other, and both lie between the smallest and the largest per-sequence "
                "rank.")


def print_compare(runs: list[Run], table: pd.DataFrame, at: int | None) -> None:
    """Several analyze runs side by side (`table` is `summaries.compare(runs, at)`): per layer, then per run."""
    summary = headlines(runs, at)
    keys = run_keys(len(runs))
    for key, run in zip(keys, runs):
        out.print(f"{key}  {run.label}, n = {run.n}, {plural(run.meta.get('samples', 0), 'sequence')}: {run.path}")
    print_frame(compare_wide(table), "Per layer, mean over heads: c at the index and the rank needed for 90% of the "
                "nuclear norm", {"rank": 1})
    summary = summary.drop(columns=["run"]).rename(columns={"c_min": "c min", "c_max": "c max", "c_mean": "c mean",
                                                           "layer_rho": "rho", "sequences": "seqs"})
    print_frame(summary.assign(run=keys)[["run", *summary.columns]],
                "Per run, over every layer × head: c at the index (min, max, mean), Spearman rho between layer index "
                "and per-layer mean c (positive: higher layers lower rank), mean rank for 90%", {"rank": 1, "rho": 2})


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


def plot(run: Run, out: str | Path | None = None) -> list[Path]:
    """Every view of the run (`plot_run`), the files written."""
    return plot_run(run, out).paths
