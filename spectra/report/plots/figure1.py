"""The paper's Figure 1 (Linformer, Wang et al. 2020): normalized cumulative singular value curves, one panel
per model depth with a line and a quantile band per run, beside the heatmap of c at index n/4 of one run.

Artists carry gids the tests read back: "curves:<layers>" per panel with "mean:<run path>" lines and
"band:<run path>" bands, and "heatmap" for the heatmap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import SpectraError
from .. import summaries
from . import (
    style,  # style.save, looked up at call time: the one name tests patch to record figures
)
from .style import draw_heatmap, index_ticks, output_paths, pyplot

if TYPE_CHECKING:  # the analyze read side imports this package: only its type here
    from ..analyze import Run


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


def check_band(quantile: float) -> float:
    """`quantile` if the band it spans (quantile to 1 − quantile) is non-empty, else a one-line SpectraError."""
    if not 0 <= quantile < 0.5:
        raise SpectraError(f"--band must be in [0, 0.5): the shaded band spans that quantile to 1 − it, got {quantile}")
    return float(quantile)


def panel_title(group: Sequence[Run]) -> str:
    """"<models> (<layers> layers), n = <n>" for one curve panel."""
    models = list(dict.fromkeys(run.meta["model"]["name"] for run in group))
    return f"{', '.join(models)} ({group[0].layers} layers), n = {group[0].n}"


def draw_curves_panel(ax, group: Sequence[Run], *, quantile: float, colors: dict[str, str], mark: int | None) -> None:
    """One line per run (mean over layers and heads) with its quantile band across layer×head curves."""
    from matplotlib.patches import Patch

    styles = ["-", "--", "-.", ":"]  # distinct per line, so curves that coincide stay visible
    n = group[0].n
    index = np.arange(1, n + 1)
    bands, lines = [], []
    for i, run in enumerate(group):
        mean, low, high = summaries.band(run, quantile)
        color = colors[run.meta["data"]["name"]]
        line_style = styles[i % len(styles)]
        bands.append(ax.fill_between(index, low, high, color=color, alpha=0.22, linewidth=0, gid=f"band:{run.path}"))
        lines += ax.plot(index, mean, color=color, linestyle=line_style, linewidth=1.8, label=run.label,
                         gid=f"mean:{run.path}")
    if mark is not None:
        ax.axvline(mark, color="0.45", linewidth=0.8, linestyle=(0, (3, 3)), zorder=0)
    ax.set_xlim(0, n)
    ax.set_xticks(index_ticks(n))
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    ax.set_ylim(top=1.005)
    ax.set_xlabel("Singular value index")
    ax.set_ylabel("Normalized cumulative singular value")
    ax.set_title(panel_title(group))
    ax.grid(alpha=0.25, linewidth=0.6)
    # each run's entry is its band under its line, in its colour (a grey band entry stood for bands that are
    # never grey); the title says what the line and the band are
    handles = [(Patch(facecolor=band.get_facecolor()[0], linewidth=0), line)
               for band, line in zip(bands, lines)]
    share = f"{quantile * 100:g}–{(1 - quantile) * 100:g}%" if quantile > 0 else "min–max"
    ax.legend(handles, [line.get_label() for line in lines], loc="lower right", frameon=True, framealpha=0.9,
              title=f"line: mean; band: {share} of layer×head curves", title_fontsize=8.5, handlelength=2.6)
    ax.set_gid(f"curves:{group[0].layers}")


def draw_figure1(runs: Sequence[Run], *, heatmap: Run | None = None, at: int | None = None, quantile: float = 0.1):
    """The paper's Figure 1: a curve panel per model depth, then the heatmap of c at index `at` (default n/4)."""
    plt = pyplot()
    if not runs:
        raise SpectraError("give at least one run directory")
    quantile = check_band(quantile)
    groups = panels(runs)
    heat = heatmap or choose_heatmap(runs)
    at = summaries.check_at(heat, summaries.default_at(heat.n) if at is None else at)
    values = summaries.c_at(heat, at)

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
    runs: Sequence[Run],
    out: str | Path = "figures/figure1",
    *,
    heatmap: Run | None = None,
    at: int | None = None,
    quantile: float = 0.1,
) -> list[Path]:
    """Draw and save Figure 1 (PNG and PDF); returns the written paths."""
    output_paths(out)  # a bad --out fails before anything is drawn
    return style.save(draw_figure1(list(runs), heatmap=heatmap, at=at, quantile=quantile), out)
