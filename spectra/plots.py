"""Figures from finished runs: the paper's Figure 1 and per-run views. Reads only Run objects, never models.

Every `draw_*` function returns a matplotlib Figure whose artists hold exactly the run's stored values
(tests read them back); the `save`-ing functions write PNG (200 dpi) and vector PDF next to each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .errors import SpectraError
from .plan import c_at, check_at, default_at, load_analyze, metric_grid
from .runs import Run

DPI = 200
HEATMAP_CMAP = "viridis"  # sequential, perceptually uniform, readable in grey
DEPTH_CMAP = "viridis"
FORMATS = ("png", "pdf")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10.5, "legend.fontsize": 8.5, "pdf.fonttype": 42})
    return plt


def as_runs(items: Iterable[Run | str | Path]) -> list[Run]:
    """Runs from Run objects or run directories (a bad path raises SpectraError)."""
    return [item if isinstance(item, Run) else load_analyze(item) for item in items]


def output_paths(out: str | Path) -> dict[str, Path]:
    """`out` with each format's suffix; a given .png/.pdf suffix is dropped first."""
    out = Path(out)
    if out.suffix.lower() in {f".{fmt}" for fmt in FORMATS}:
        out = out.with_suffix("")
    if out.exists() and out.is_dir():
        raise SpectraError(f"--out {out} is a directory; give a file name without suffix, e.g. {out / 'figure1'}")
    return {fmt: out.with_name(out.name + f".{fmt}") for fmt in FORMATS}


def save(figure, out: str | Path) -> list[Path]:
    """Write the figure as PNG (200 dpi) and PDF; returns the paths."""
    plt = _pyplot()
    paths = output_paths(out)
    paths["png"].parent.mkdir(parents=True, exist_ok=True)
    try:
        for fmt, path in paths.items():
            figure.savefig(path, dpi=DPI if fmt == "png" else None, bbox_inches="tight")
    finally:
        plt.close(figure)
    return list(paths.values())


# ---------------------------------------------------------------- shared pieces


def band(run: Run, quantile: float = 0.1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean curve over all layer×head mean curves and its `quantile`–(1 − quantile) band, each of length n."""
    curves = np.asarray(run.cum_mean, dtype=float).reshape(run.layers * run.heads, run.n)
    low, high = np.quantile(curves, [quantile, 1 - quantile], axis=0)
    return curves.mean(axis=0), low, high


def _ticks(count: int, most: int = 16) -> np.ndarray:
    """0-based tick positions, thinned so at most about `most` labels show."""
    step = max(1, math.ceil(count / most))
    return np.arange(0, count, step)


def _index_ticks(n: int) -> list[float]:
    """Ticks at 0, n/4 and n (the paper's 0, 128, 512)."""
    return sorted({0.0, n / 4, float(n)})


def draw_heatmap(ax, values: np.ndarray, *, title: str, colorbar: str, digits: int | None = None):
    """Layer index down, head index across, sequential colours and a colour bar; `digits` annotates cells."""
    plt = _pyplot()
    values = np.asarray(values, dtype=float)
    layers, heads = values.shape
    # pcolormesh, not imshow: the PDF gets one vector cell per (layer, head), never a resampled bitmap
    image = ax.pcolormesh(np.arange(heads + 1) - 0.5, np.arange(layers + 1) - 0.5, values, cmap=HEATMAP_CMAP,
                          shading="flat", edgecolors="face", linewidth=0.0)
    ax.set_xlim(-0.5, heads - 0.5)
    ax.set_ylim(layers - 0.5, -0.5)  # layer 0 on top, as in the paper
    ax.set_xticks(_ticks(heads))
    ax.set_yticks(_ticks(layers))
    ax.set_xlabel("Head index")
    ax.set_ylabel("Layer index")
    ax.set_title(title)
    ax.tick_params(length=2)
    bar = plt.colorbar(image, ax=ax, fraction=0.06, pad=0.03)
    bar.set_label(colorbar)
    if digits is not None:
        low, high = np.nanmin(values), np.nanmax(values)
        middle = (low + high) / 2
        size = 7 if heads <= 8 else 5.5
        for (row, col), value in np.ndenumerate(values):
            ax.text(col, row, f"{value:.{digits}f}", ha="center", va="center", fontsize=size,
                    color="black" if value > middle else "white")
    ax.set_gid("heatmap")
    return image


def _heatmap_size(layers: int, heads: int) -> tuple[float, float]:
    """Inches for one heatmap with its colour bar: cells shrink past 12 rows or columns."""
    width = 1.8 + 0.42 * min(max(heads, 6), 12) + 0.26 * max(heads - 12, 0)
    height = 1.4 + 0.3 * min(max(layers, 8), 12) + 0.17 * max(layers - 12, 0)
    return width, height


def _annotate_digits(values: np.ndarray, spread: bool) -> int | None:
    """Cell labels only where they fit: at most 12 heads and 24 layers."""
    layers, heads = values.shape
    if heads > 12 or layers > 24:
        return None
    return 2 if spread else 0


# ---------------------------------------------------------------- Figure 1


def panels(runs: Sequence[Run]) -> list[list[Run]]:
    """The left panels: runs grouped by model depth (fewest layers first), each panel of one n."""
    groups: dict[int, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.layers, []).append(run)
    result = [groups[depth] for depth in sorted(groups)]
    for group in result:
        lengths = sorted({run.n for run in group})
        if len(lengths) > 1:
            names = ", ".join(f"{run.path} (n = {run.n})" for run in group)
            raise SpectraError(
                f"the {group[0].layers}-layer panel mixes runs of different n ({names}); "
                "give runs of one sequence length per model depth"
            )
    return result


def choose_heatmap(runs: Sequence[Run]) -> Run:
    """The paper's choice, generalised: the first Wikitext run among the shallowest runs, else the first run."""
    shallowest = min(run.layers for run in runs)
    for run in runs:
        if run.layers == shallowest and str(run.meta["data"]["name"]).lower().startswith("wikitext"):
            return run
    return runs[0]


def _panel_title(group: Sequence[Run]) -> str:
    models = list(dict.fromkeys(run.meta["model"]["name"] for run in group))
    return f"{', '.join(models)} ({group[0].layers} layers), n = {group[0].n}"


def draw_curves_panel(ax, group: Sequence[Run], *, quantile: float, colors: dict[str, str], mark: int | None) -> None:
    """One line per run (mean over layers and heads) with its quantile band across layer×head curves."""
    from matplotlib.patches import Patch

    styles = ["-", "--", "-.", ":"]  # distinct per line, so curves that coincide stay visible
    n = group[0].n
    index = np.arange(1, n + 1)
    for i, run in enumerate(group):
        mean, low, high = band(run, quantile)
        color = colors[run.meta["data"]["name"]]
        style = styles[i % len(styles)]
        ax.fill_between(index, low, high, color=color, alpha=0.22, linewidth=0, gid=f"band:{run.path}")
        ax.plot(index, mean, color=color, linestyle=style, linewidth=1.8, label=run.label, gid=f"mean:{run.path}")
    if mark is not None:
        ax.axvline(mark, color="0.45", linewidth=0.8, linestyle=(0, (3, 3)), zorder=0)
    ax.set_xlim(0, n)
    ax.set_xticks(_index_ticks(n))
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    ax.set_ylim(top=1.005)
    ax.set_xlabel("Singular value index")
    ax.set_ylabel("Normalized cumulative singular value")
    ax.set_title(_panel_title(group))
    ax.grid(alpha=0.25, linewidth=0.6)
    handles, labels = ax.get_legend_handles_labels()
    share = f"{quantile * 100:g}–{(1 - quantile) * 100:g}%" if quantile > 0 else "min–max"
    handles.append(Patch(color="0.6", alpha=0.4, linewidth=0))
    labels.append(f"{share} of layer×head curves")
    ax.legend(handles, labels, loc="lower right", frameon=True, framealpha=0.9)
    ax.set_gid(f"curves:{group[0].layers}")


def check_band(quantile: float) -> float:
    if not 0 <= quantile < 0.5:
        raise SpectraError(f"--band must be in [0, 0.5): the shaded band spans that quantile to 1 − it, got {quantile}")
    return float(quantile)


def draw_figure1(runs: Sequence[Run], *, heatmap: Run | None = None, at: int | None = None, quantile: float = 0.1):
    """The paper's Figure 1: a curve panel per model depth, then the heatmap of c at index `at` (default n/4)."""
    plt = _pyplot()
    if not runs:
        raise SpectraError("give at least one run directory")
    quantile = check_band(quantile)
    groups = panels(runs)
    heat = heatmap or choose_heatmap(runs)
    at = check_at(heat, default_at(heat.n) if at is None else at)
    values = c_at(heat, at)

    datasets = list(dict.fromkeys(run.meta["data"]["name"] for run in runs))
    palette = plt.get_cmap("tab10").colors
    colors = {name: palette[i % len(palette)] for i, name in enumerate(datasets)}

    width = 4.4 * len(groups) + 4.8
    figure = plt.figure(figsize=(width, 4.0), layout="constrained")
    grid = figure.add_gridspec(1, len(groups) + 1, width_ratios=[1] * len(groups) + [1.05])
    for i, group in enumerate(groups):
        ax = figure.add_subplot(grid[0, i])
        draw_curves_panel(ax, group, quantile=quantile, colors=colors, mark=at if group[0].n == heat.n else None)
    ax = figure.add_subplot(grid[0, -1])
    draw_heatmap(ax, values, title=f"Normalized cumulative value at index {at}\n{heat.label}, n = {heat.n}",
                 colorbar=f"c at index {at}")
    return figure


def figure1(
    runs: Sequence[Run | str | Path],
    out: str | Path = "figures/figure1",
    *,
    heatmap: Run | str | Path | None = None,
    at: int | None = None,
    quantile: float = 0.1,
) -> list[Path]:
    """Draw and save Figure 1 (PNG and PDF); returns the written paths."""
    loaded = as_runs(runs)
    heat = None if heatmap is None else _find(loaded, heatmap)
    output_paths(out)
    return save(draw_figure1(loaded, heatmap=heat, at=at, quantile=quantile), out)


def _find(runs: Sequence[Run], item: Run | str | Path) -> Run:
    """The heatmap run: one of `runs` when it names the same directory, else loaded from its path."""
    if isinstance(item, Run):
        return item
    path = Path(item).resolve()
    for run in runs:
        if Path(run.path).resolve() == path:
            return run
    return load_analyze(item)


# ---------------------------------------------------------------- per-run views


def _subtitle(run: Run) -> str:
    samples = run.meta.get("samples")
    return f"{run.label}, n = {run.n}" + (f", {samples} sequences" if samples else "")


def draw_layer_curves(run: Run):
    """A line per layer (mean over heads), coloured from shallow to deep, with a layer colour bar."""
    plt = _pyplot()
    from matplotlib.colors import BoundaryNorm

    figure, ax = plt.subplots(figsize=(6.2, 4.2), layout="constrained")
    cmap = plt.get_cmap(DEPTH_CMAP)
    norm = BoundaryNorm(np.arange(run.layers + 1) - 0.5, cmap.N)
    index = np.arange(1, run.n + 1)
    curves = np.asarray(run.cum_mean, dtype=float).mean(axis=1)
    for layer, curve in enumerate(curves):
        ax.plot(index, curve, color=cmap(norm(layer)), linewidth=1.4, label=f"layer {layer}", gid=f"layer:{layer}")
    ax.set_xlim(0, run.n)
    ax.set_xticks(_index_ticks(run.n))
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    ax.set_ylim(top=1.005)
    ax.set_xlabel("Singular value index")
    ax.set_ylabel("Normalized cumulative singular value")
    ax.set_title(f"Mean over {run.heads} heads per layer\n{_subtitle(run)}")
    ax.grid(alpha=0.25, linewidth=0.6)
    bar = figure.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, fraction=0.05, pad=0.02)
    bar.set_ticks(_ticks(run.layers, most=12))
    bar.set_label("Layer index (0 = lowest)")
    ax.set_gid("curves")
    return figure


def draw_c_heatmap(run: Run, at: int | None = None):
    """Heatmap of the mean normalized cumulative value at index `at` (default the run's stored index)."""
    plt = _pyplot()
    at = run.at if at is None else check_at(run, at)
    values = c_at(run, at)
    figure, ax = plt.subplots(figsize=_heatmap_size(run.layers, run.heads), layout="constrained")
    draw_heatmap(ax, values, title=f"Normalized cumulative value at index {at}\n{_subtitle(run)}",
                 colorbar=f"c at index {at}", digits=_annotate_digits(values, spread=True))
    return figure


def draw_rank_heatmaps(run: Run):
    """Side-by-side heatmaps of the mean number of singular values needed for 90% and 99% of the nuclear norm."""
    plt = _pyplot()
    width, height = _heatmap_size(run.layers, run.heads)
    figure, axes = plt.subplots(1, 2, figsize=(2 * width, height + 0.3), layout="constrained")
    for ax, energy in zip(axes, (90, 99)):
        values = metric_grid(run, f"rank{energy}_mean")
        draw_heatmap(ax, values, title=f"Rank needed for {energy}%", colorbar="Number of singular values (mean over sequences)",
                     digits=_annotate_digits(values, spread=False))
        ax.set_gid(f"rank{energy}")
    figure.suptitle(_subtitle(run))
    return figure


@dataclass
class RunPlots:
    """Paths written by `plot_run`, by view."""

    curves: list[Path]
    heatmap: list[Path]
    rank: list[Path]

    @property
    def paths(self) -> list[Path]:
        return [*self.curves, *self.heatmap, *self.rank]


def default_plot_dir(run: Run) -> Path:
    return Path("figures") / Path(run.path).name


def plot_run(run: Run | str | Path, out: str | Path | None = None, *, at: int | None = None) -> RunPlots:
    """Write the per-run views (layer curves, c heatmap at `at`, rank heatmaps) into directory `out`."""
    run = as_runs([run])[0]
    at = run.at if at is None else check_at(run, at)
    folder = Path(out) if out is not None else default_plot_dir(run)
    if folder.exists() and not folder.is_dir():
        raise SpectraError(f"--out {folder} exists and is not a directory; give a directory for the figures")
    return RunPlots(
        curves=save(draw_layer_curves(run), folder / "curves"),
        heatmap=save(draw_c_heatmap(run, at), folder / f"c_at{at}"),
        rank=save(draw_rank_heatmaps(run), folder / "rank"),
    )
