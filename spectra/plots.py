"""Figures from finished runs: the paper's Figure 1, per-run views, and the views of `approx` and `theorems`
runs. Reads only run objects, never models.

Every `draw_*` function returns a matplotlib Figure whose artists hold exactly the run's stored values
(tests read them back); the `save`-ing functions write PNG (200 dpi) and vector PDF next to each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import SpectraError
from .plan import c_at, check_at, default_at, load_analyze, metric_grid
from .runs import ApproxRun, Run, TheoremRun, load_run

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


# ---------------------------------------------------------------- approx and theorems runs

#: colour and marker per method label, the same in every figure; svd (the Eckart–Young floor) in black
METHOD_STYLES: dict[str, tuple[str, str]] = {
    "svd": ("black", "s"),
    "jl": ("tab:orange", "o"),
    "linformer(none)": ("tab:blue", "^"),
    "linformer(headwise)": ("tab:cyan", "v"),
    "linformer(kv)": ("tab:purple", "D"),
    "linformer(layerwise)": ("tab:pink", "P"),
    "pool-mean": ("tab:green", "X"),
    "pool-max": ("tab:olive", "*"),
    "performer": ("tab:red", "<"),
    "nystrom": ("tab:brown", ">"),
    "nystrom-iter6": ("#c49c94", "h"),
    "skyformer": ("tab:gray", "p"),
    "probsparse": ("#637939", "d"),
    "theorem2(delta=1/2^n)": ("tab:red", "<"),
    "theorem2(delta=1/n)": ("tab:brown", ">"),
}
_SPARE_MARKERS = "os^vDPX*<>hpd"
EXACT_STYLE = dict(color="0.3", linestyle="--", linewidth=1.1, zorder=1)


def method_style(label: str, index: int = 0) -> dict:
    """Line keyword arguments for a method label: fixed colour and marker, dashed for Theorem 2's δ variants."""
    plt = _pyplot()
    from .methods import REGISTRY

    if label in REGISTRY:
        color, marker = REGISTRY[label].color, REGISTRY[label].marker
    elif label in METHOD_STYLES:
        color, marker = METHOD_STYLES[label]
    else:
        color, marker = plt.get_cmap("tab20").colors[(2 * index + 1) % 20], _SPARE_MARKERS[index % len(_SPARE_MARKERS)]
    dashed = label.startswith("theorem2(")
    return dict(color=color, marker=marker, markersize=5, linewidth=1.5, linestyle="--" if dashed else "-")


def _k_axis(ax, budgets: Sequence[int], label: str = "Projected dimension k") -> tuple[float, float]:
    """Log2 x axis with a tick at every budget and a little room on each side; returns the limits."""
    from matplotlib.ticker import NullLocator

    budgets = sorted({int(k) for k in budgets})
    ax.set_xscale("log", base=2)
    low, high = budgets[0] / 1.25, budgets[-1] * 1.25
    ax.set_xlim(low, high)
    ax.set_xticks(budgets)
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)
    return low, high


def _log_y(axes: Sequence, decades: float = 5.0) -> bool:
    """One log y range for `axes` (shared axes agree), at most `decades` decades below the largest value.

    Values under the bottom — an exact method (svd or pooling at k = n) gives 0 or float round-off — keep
    their stored value in the line and get a ▼ on the bottom edge (gid "below:<line gid>"). True if any do.
    """
    lines = [line for ax in axes for line in ax.get_lines()]
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in lines] or [np.zeros(0)])
    positive = values[np.isfinite(values) & (values > 0)]
    from matplotlib.ticker import LogLocator, NullFormatter

    for ax in axes:
        ax.set_yscale("log", nonpositive="mask")
        ax.grid(alpha=0.25, linewidth=0.6, which="major")
        ax.grid(alpha=0.1, linewidth=0.4, which="minor", axis="y")
    if not len(positive):
        return False
    bottom, top = max(positive.min() / 1.6, positive.max() * 10.0**-decades), positive.max() * 1.6
    below = False
    for ax in axes:
        ax.set_ylim(bottom, top)
        if top / bottom >= 100:  # two decades or more: decades labelled, minor ticks at 2 and 5 (quick to lay out)
            ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
            ax.yaxis.set_minor_formatter(NullFormatter())
        below |= _mark_below(ax, bottom)
    return below


def _mark_below(ax, bottom: float) -> bool:
    """▼ on the bottom edge for every point under `bottom`, side by side (5.5 points apart) where lines share one."""
    from matplotlib.transforms import offset_copy

    marks = []
    for line in ax.get_lines():
        x, y = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)
        low = np.isfinite(y) & (y < bottom)
        if low.any():
            marks.append((line, x[low]))
    for i, (line, x) in enumerate(marks):
        shift = offset_copy(ax.transData, fig=ax.figure, x=5.5 * (i - (len(marks) - 1) / 2), units="points")
        ax.plot(x, np.full(len(x), bottom), linestyle="none", marker="v", markersize=6, color=line.get_color(),
                clip_on=False, zorder=5, transform=shift, gid=f"below:{line.get_gid()}")
    return bool(marks)


def _below_entry(handles: list, labels: list, below: bool) -> tuple[list, list]:
    """The legend entry explaining ▼ marks, when there are any."""
    if below:
        from matplotlib.lines import Line2D

        handles = [*handles, Line2D([], [], color="0.3", marker="v", markersize=6, linestyle="none")]
        labels = [*labels, "below the axis (≈ 0: exact)"]
    return handles, labels


def _outside_legend(figure, handles, labels, title: str | None = None) -> None:
    """One legend for the whole figure, right of the panels, so it never covers data (figures with an axis title)."""
    figure.legend(handles, labels, loc="outside right upper", frameon=False, title=title, alignment="left")


def _bottom_legend(figure, handles, labels) -> None:
    """One legend below the panels, in as many columns as the width holds (figures with a suptitle on top)."""
    columns = max(1, min(len(labels), int(figure.get_figwidth() / 2.0)))
    figure.legend(handles, labels, loc="outside lower center", ncols=columns, frameon=False)


def _plot_folder(run: Run | ApproxRun | TheoremRun, out: str | Path | None) -> Path:
    folder = Path(out) if out is not None else default_plot_dir(run)
    if folder.exists() and not folder.is_dir():
        raise SpectraError(f"--out {folder} exists and is not a directory; give a directory for the figures")
    return folder


def _loaded(run, kind: type):
    """A run object of `kind`, loading a directory path first."""
    loaded = run if isinstance(run, kind) else load_run(run)
    if not isinstance(loaded, kind):
        raise SpectraError(f"{loaded.path} is not a{'n approx' if kind is ApproxRun else ' theorems'} run")
    return loaded


def _methods(frame: pd.DataFrame, column: str = "method") -> list[str]:
    return list(dict.fromkeys(frame[column]))


def _approx_subtitle(run: ApproxRun) -> str:
    samples = run.meta.get("samples")
    return f"{run.label}, n = {run.meta['n']}" + (f", {samples} sequences" if samples else "")


OUT_ERR_LABEL = "Relative output error ‖PV − P̃V‖ / ‖PV‖"


def _grid(count: int) -> tuple[int, int]:
    """Rows and columns for `count` panels: one row up to three, 2 × 2 for four, else rows of three."""
    columns = count if count <= 3 else 2 if count == 4 else 3
    return math.ceil(count / columns), columns


def draw_approx_layers(run: ApproxRun):
    """Error vs layer, one panel per budget k: a line per method (mean over heads of `out_err`), log y shared
    by the panels, the --target dashed."""
    plt = _pyplot()
    per_layer = run.per_layer("out_err")
    budgets = sorted(per_layer["budget"].unique())
    methods = _methods(per_layer)
    layers = sorted(per_layer["layer"].unique())
    rows, columns = _grid(len(budgets))
    figure, axes = plt.subplots(rows, columns, figsize=(max(3.6 * columns + 0.9, 6.4), 2.9 * rows + 1.7), sharey=True,
                                squeeze=False, layout="constrained")
    used = axes.flat[:len(budgets)]
    for ax, budget in zip(used, budgets):
        rows_k = per_layer[per_layer["budget"] == budget]
        for i, method in enumerate(methods):
            line = rows_k[rows_k["method"] == method].sort_values("layer")
            ax.plot(line["layer"], line["out_err"], label=method, gid=method, **method_style(method, i))
        ax.axhline(run.meta["target"], label=f"target {run.meta['target']:g}", gid="target", **EXACT_STYLE)
        ax.set_xticks(_ticks(len(layers), most=12) + layers[0])
        ax.set_xlim(layers[0] - 0.3, layers[-1] + 0.3)
        ax.set_title(f"k = {budget}")
        ax.set_gid(f"layers:k={budget}")
    below = _log_y(used)
    for i, ax in enumerate(axes.flat):
        if i >= len(budgets):
            ax.set_visible(False)
        elif i + columns >= len(budgets):  # no panel below it
            ax.set_xlabel("Layer index")
    for ax in axes[:, 0]:
        ax.set_ylabel("Relative output error\n(mean over heads)")
    _bottom_legend(figure, *_below_entry(*used[0].get_legend_handles_labels(), below))
    figure.suptitle(f"{OUT_ERR_LABEL} per layer\n{_approx_subtitle(run)}")
    return figure


def approx_by_budget(run: ApproxRun, metric: str = "out_err") -> pd.DataFrame:
    """Mean over layers of the per-layer mean over heads: one row per (method, budget)."""
    per_layer = run.per_layer(metric)
    return per_layer.groupby(["method", "budget"], sort=False)[metric].mean().reset_index()


def draw_approx_budgets(run: ApproxRun):
    """Error vs k: a line per method (mean over layers and heads of `out_err`), log y, the --target dashed."""
    plt = _pyplot()
    table = approx_by_budget(run)
    figure, ax = plt.subplots(figsize=(6.8, 4.2), layout="constrained")
    for i, method in enumerate(_methods(table)):
        line = table[table["method"] == method].sort_values("budget")
        ax.plot(line["budget"], line["out_err"], label=method, gid=method, **method_style(method, i))
    ax.axhline(run.meta["target"], label=f"target {run.meta['target']:g}", gid="target", **EXACT_STYLE)
    _k_axis(ax, table["budget"], "Budget k")
    below = _log_y([ax])
    ax.set_ylabel("Relative output error\n(mean over layers and heads)")
    ax.set_title(f"{OUT_ERR_LABEL} vs k\n{_approx_subtitle(run)}")
    ax.set_gid("budgets")
    _outside_legend(figure, *_below_entry(*ax.get_legend_handles_labels(), below), title="method")
    return figure


def _maybe_log(ax, ratio: float = 5.0) -> bool:
    """Log y (see `_log_y`) when the positive values drawn span more than `ratio`, else linear."""
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()])
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() / values.min() > ratio:
        return _log_y([ax])
    ax.grid(alpha=0.25, linewidth=0.6)
    return False


def draw_end_to_end(run: ApproxRun):
    """With the MLM head: masked-LM perplexity vs k per method, the exact model's dashed, beside the hidden-state
    drift vs k; without it: the drift only."""
    plt = _pyplot()
    table = run.end_to_end
    if table is None:
        raise SpectraError(f"{run.path} has no end-to-end results; run spectra approx with --end-to-end")
    with_ppl = "ppl" in table.columns and table["ppl"].notna().any()
    panels = [("ppl", "Masked-LM perplexity"), ("hidden_rel_err", "Relative last-hidden-state error")]
    panels = panels if with_ppl else panels[1:]
    figure, axes = plt.subplots(1, len(panels), figsize=(max(4.6 * len(panels) + 0.6, 6.4), 4.9), squeeze=False,
                                layout="constrained")
    methods = _methods(table)
    below = False
    for ax, (column, label) in zip(axes[0], panels):
        for i, method in enumerate(methods):
            line = table[table["method"] == method].sort_values("budget")
            ax.plot(line["budget"], line[column], label=method, gid=method, **method_style(method, i))
        if column == "ppl":
            exact = float(table["ppl_exact"].iloc[0])
            ax.axhline(exact, label=f"exact model ({exact:.4g})", gid="exact", **EXACT_STYLE)
        _k_axis(ax, table["budget"], "Budget k")
        below |= _maybe_log(ax)
        ax.set_ylabel(label)
        ax.set_title(label + " vs k")
        ax.set_gid(column)
    _bottom_legend(figure, *_below_entry(*axes[0, 0].get_legend_handles_labels(), below))
    layers = table["layers"].iloc[0]
    plural = "s" if any(mark in str(layers) for mark in ",-") else ""
    where = "every layer's attention" if layers == "all" else f"the attention of layer{plural} {layers}"
    figure.suptitle(f"End to end, {where} substituted\n{_approx_subtitle(run)}")
    return figure


def plot_approx(run: ApproxRun | str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the views of an approx run into directory `out` (default figures/<run directory name>):
    error vs layer per k, error vs k, and with --end-to-end perplexity (or drift) vs k. Returns the paths."""
    run = _loaded(run, ApproxRun)
    folder = _plot_folder(run, out)
    paths = save(draw_approx_layers(run), folder / "error_vs_layer")
    paths += save(draw_approx_budgets(run), folder / "error_vs_k")
    if run.end_to_end is not None:
        paths += save(draw_end_to_end(run), folder / "end_to_end")
    return paths


def theorem1_bound_curve(eps: float, n: int, k: np.ndarray) -> np.ndarray:
    """Theorem 1's success bound max(0, 1 − 2n e^{−(ε²−ε³)k/4}) at (real) k."""
    return np.maximum(0.0, 1.0 - 2.0 * n * np.exp(-(eps**2 - eps**3) * np.asarray(k, dtype=float) / 4.0))


def _theorem_subtitle(run: TheoremRun, n: int) -> str:
    samples = run.meta.get("samples")
    return f"{run.label}, n = {n}" + (f", {samples} sequences" if samples else "")


def draw_theorem1(run: TheoremRun):
    """Theorem 1: empirical Pr(‖P̃w − Pw‖ ≤ ε‖Pw‖) of jl vs k per ε (solid, markers), the bound dashed on a
    fine k grid in the same colour, and Theorem 1's k(ε) dotted where it falls inside the axis."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    one = run.tables["theorem1"]
    jl = one[one["method"] == "jl"]
    n = int(one["n"].iloc[0])
    eps_values = sorted(jl["eps"].unique())
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.8, len(eps_values)))
    figure, ax = plt.subplots(figsize=(7.6, 4.4), layout="constrained")
    low, high = _k_axis(ax, jl["k_proj"])
    grid = np.geomspace(low, high, 400)
    handles, labels = [], []
    for eps, color in zip(eps_values, colors):
        rows = jl[jl["eps"] == eps].sort_values("k_proj")
        k_theory = float(rows["k_theory"].iloc[0])
        ax.plot(grid, theorem1_bound_curve(eps, n, grid), color=color, linestyle="--", linewidth=1.3, zorder=2,
                gid=f"bound:{eps:g}")
        line, = ax.plot(rows["k_proj"], rows["pr"], color=color, marker="o", markersize=5, linewidth=1.6, zorder=3,
                        gid=f"pr:{eps:g}")
        if low <= k_theory <= high:
            ax.axvline(k_theory, color=color, linestyle=":", linewidth=1.4, zorder=1, gid=f"k_theory:{eps:g}")
        handles.append(line)
        labels.append(f"ε = {eps:g}: k(ε) = {k_theory:,.0f}")
    handles += [Line2D([], [], color="0.25", marker="o", markersize=5, linewidth=1.6),
                Line2D([], [], color="0.25", linestyle="--", linewidth=1.3),
                Line2D([], [], color="0.25", linestyle=":", linewidth=1.4)]
    labels += ["jl, empirical", "Theorem 1 bound\nmax(0, 1 − 2n exp(−(ε²−ε³)k/4))",
               "Theorem 1's k(ε) = 5 ln n / (ε²−ε³)\n(drawn where inside the axis)"]
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("Pr(‖P̃w − Pw‖ ≤ ε ‖Pw‖)")
    ax.grid(alpha=0.25, linewidth=0.6)
    ax.set_title(f"Theorem 1, P̃ = P RᵀR: success probability vs k\n{_theorem_subtitle(run, n)}")
    ax.set_gid("theorem1")
    _outside_legend(figure, handles, labels)
    return figure


def theorem_errors(run: TheoremRun, relative_to: str = "output") -> pd.DataFrame:
    """Pooled errors per (label, k_proj): jl, svd (Theorem 1, per column w of V), linformer(<sharing>) and
    theorem2(<variant>) (Theorem 2, per row w, relative to ‖softmax(w)V‖ or, with "rhs", its right side);
    columns label, k_proj, median, p95, mean, max."""
    one, two = run.tables["theorem1"], run.tables["theorem2"]
    arch = two[two["method"] == "linformer"]
    delta = two[(two["method"] == "theorem2") & (two["relative_to"] == relative_to)]
    parts = [one.assign(label=one["method"]),
             arch.assign(label="linformer(" + arch["variant"] + ")"),
             delta.assign(label="theorem2(" + delta["variant"] + ")")]
    columns = ["label", "k_proj", "median", "p95", "mean", "max"]
    return pd.concat(parts).drop_duplicates(["label", "k_proj"])[columns].reset_index(drop=True)


def draw_theorem_errors(run: TheoremRun):
    """Median and p95 relative error vs k (log y): jl, svd (floor), each linformer sharing level and Theorem 2's
    δ variants (relative to ‖softmax(w)V‖)."""
    plt = _pyplot()
    table = theorem_errors(run)
    n = int(run.tables["theorem1"]["n"].iloc[0])
    figure, axes = plt.subplots(1, 2, figsize=(10.0, 5.2), sharey=True, layout="constrained")
    for ax, (stat, title) in zip(axes, (("median", "Median"), ("p95", "95th percentile"))):
        for i, label in enumerate(_methods(table, "label")):
            line = table[table["label"] == label].sort_values("k_proj")
            ax.plot(line["k_proj"], line[stat], label=label, gid=label, **method_style(label, i))
        _k_axis(ax, table["k_proj"])
        ax.set_title(f"{title} relative error")
        ax.set_gid(stat)
    below = _log_y(axes)
    axes[0].set_ylabel("Relative error")
    _bottom_legend(figure, *_below_entry(*axes[0].get_legend_handles_labels(), below))
    figure.suptitle("jl, svd (best rank-k floor): ‖P̃w − Pw‖ / ‖Pw‖ per column w of V\n"
                    "linformer, theorem2: ‖P̃V − softmax(w)V‖ / ‖softmax(w)V‖ per row w\n"
                    + _theorem_subtitle(run, n), fontsize=10.5)
    return figure


def plot_theorems(run: TheoremRun | str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the views of a theorems run into directory `out` (default figures/<run directory name>):
    Theorem 1's success probability vs k against its bound, and the errors vs k. Returns the paths."""
    run = _loaded(run, TheoremRun)
    folder = _plot_folder(run, out)
    return save(draw_theorem1(run), folder / "theorem1_probability") + save(draw_theorem_errors(run),
                                                                           folder / "errors_vs_k")
