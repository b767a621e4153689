"""The views of a task run of `spectra cache` (`report.tasks.TaskRun`), drawn from its tables only:

- task_scores: per task a panel of the mean score against the ratio of the cache removed, a line per press from the
  full cache at ratio 0, its 95% bootstrap interval as error bars, the full cache's score dotted grey;
- needle_heatmap: per press (rows, the full cache first) and ratio (columns), the mean score over the examples at
  each needle depth (down) and length (across): where in the context, and how far away, a press loses the needle;
- needle_survival_r<ratio>: per press, the share of the needle each layer (down) and key/value head (across) kept at
  that ratio, beside the full cache's attention mass of the question on the needle (why a press fails: item 4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..tasks import TaskRun
from . import style
from .cache import FULL_STYLE, panel_legend, press_style
from .style import plot_folder, pyplot


def presses_of(table) -> list[str]:
    """The compressing presses of a table, in the run's order."""
    return [press for press in dict.fromkeys(table["press"]) if press != "full"]


def draw_scores(run: TaskRun):
    """Score vs ratio per task (see the module docstring)."""
    plt = pyplot()
    scores = run.scores
    tasks = list(dict.fromkeys(scores["task"]))
    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.6 * rows + 0.8), squeeze=False,
                                layout="constrained")
    presses = presses_of(scores)
    for ax, task in zip(axes.flat, tasks):
        mine = scores[scores["task"] == task]
        full = mine[mine["press"] == "full"].iloc[0]
        for index, press in enumerate(presses):
            line = mine[mine["press"] == press].sort_values("ratio")
            color, marker = press_style(press, index)
            ratios = np.r_[0.0, line["ratio"]]
            values = np.r_[full["score"], line["score"]]
            low = np.r_[full["low"], line["low"]]
            high = np.r_[full["high"], line["high"]]
            drawn = ax.errorbar(ratios, values, yerr=[values - low, high - values], color=color, marker=marker,
                                markersize=4, linewidth=1.2, capsize=2, label=press)
            drawn.lines[0].set_gid(f"score:{task}:{press}")
        ax.axhline(full["score"], label=f"full cache ({full['score']:.2f})", gid=f"full:{task}", **FULL_STYLE)
        ax.set_title(f"{task} ({int(full['examples'])} examples)")
        ax.set_xlabel("Ratio of the cache removed")
        ax.set_ylabel("Mean score")
        ax.set_ylim(-0.05, 1.05)
        panel_legend(ax)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    figure.suptitle(f"{run.label}: score per task against the ratio removed (95% bootstrap intervals)")
    return figure


def depth_length_grid(examples) -> tuple[list[float], list[int], dict[tuple[str, float], np.ndarray]]:
    """(depths, lengths, {(press, ratio): mean score (depths, lengths)}) over the examples with a depth."""
    placed = examples.dropna(subset=["depth"])
    depths = sorted(placed["depth"].unique())
    lengths = sorted(placed["length"].unique())
    grids = {}
    for (press, ratio), group in placed.groupby(["press", "ratio"], sort=False):
        mean = group.groupby(["depth", "length"])["score"].mean()
        grids[(press, ratio)] = np.array([[mean.get((depth, length), np.nan) for length in lengths]
                                          for depth in depths])
    return depths, lengths, grids


def draw_needle(run: TaskRun):
    """Mean score per needle depth × length, per press and ratio (see the module docstring)."""
    plt = pyplot()
    depths, lengths, grids = depth_length_grid(run.examples)
    if not depths:
        return None
    presses = presses_of(run.examples)
    ratios = sorted({ratio for press, ratio in grids if press != "full"})
    figure, axes = plt.subplots(len(presses) + 1, max(1, len(ratios)), squeeze=False, layout="constrained",
                                figsize=(2.3 * max(1, len(ratios)) + 1.2, 1.9 * (len(presses) + 1) + 0.6))
    image = None
    for row, press in enumerate(["full", *presses]):
        for column, ratio in enumerate(ratios or [0.0]):
            ax = axes[row, column]
            key = ("full", 0.0) if press == "full" else (press, ratio)
            values = grids.get(key)
            if press == "full" and column > 0 or values is None:
                ax.set_visible(False)
                continue
            image = ax.pcolormesh(np.arange(len(lengths) + 1) - 0.5, np.arange(len(depths) + 1) - 0.5, values,
                                  cmap=style.HEATMAP_CMAP, vmin=0, vmax=1, shading="flat",
                                  gid=f"needle:{key[0]}:{key[1]}")
            ax.set_ylim(len(depths) - 0.5, -0.5)
            ax.set_xticks(range(len(lengths)), [str(int(length)) for length in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{depth:.2f}" for depth in depths], fontsize=7)
            ax.set_title("full cache" if press == "full" else f"{press}, ratio {ratio:g}", fontsize=8.5)
            if column == 0:
                ax.set_ylabel("Needle depth")
            if row == len(presses):
                ax.set_xlabel("Length (tokens)")
    if image is not None:
        plt.colorbar(image, ax=axes, fraction=0.03, pad=0.02).set_label("Mean score")
    figure.suptitle(f"{run.label}: score by needle depth and length")
    return figure


def layer_head_mesh(ax, values: np.ndarray, title: str, gid: str, vmax: float | None = 1.0):
    """Layers down, key/value heads across, on the shared sequential scale [0, `vmax`] (None: the values' own)."""
    layers, heads = values.shape
    image = ax.pcolormesh(np.arange(heads + 1) - 0.5, np.arange(layers + 1) - 0.5, values, cmap=style.HEATMAP_CMAP,
                          vmin=0.0, vmax=vmax, shading="flat", edgecolors="face", linewidth=0.0)
    ax.set_ylim(layers - 0.5, -0.5)
    ax.set_xticks(range(heads))
    ax.set_yticks(style.ticks(layers))
    ax.set_xlabel("KV head")
    ax.set_title(title, fontsize=9)
    ax.set_gid(gid)
    return image


def draw_survival(run: TaskRun, ratio: float):
    """The needle kept per layer and key/value head by each press at `ratio` (one scale, 0 to 1), and the full
    cache's attention mass of the question on it (its own scale)."""
    plt = pyplot()
    needle = run.needle
    heads = int(needle["head"].max()) + 1
    layers = int(needle["layer"].max()) + 1
    presses = [press for press in presses_of(needle)
               if needle[(needle["press"] == press) & (needle["ratio"] == ratio)]["needle_kept"].notna().any()]
    panels = len(presses) + 1
    figure, axes = plt.subplots(1, panels, figsize=(1.5 * panels * max(1.0, heads / 4) + 2.0, 5.4), squeeze=False,
                                layout="constrained", sharey=True)

    def grid(frame, column):
        return frame.sort_values(["layer", "head"])[column].to_numpy().reshape(layers, heads)

    full = needle[needle["press"] == "full"]
    mass = layer_head_mesh(axes[0, 0], grid(full, "needle_mass"), "full cache:\nattention on it", "mass", None)
    axes[0, 0].set_ylabel("Layer")
    plt.colorbar(mass, ax=axes[0, 0], location="left", fraction=0.12, pad=0.25).set_label("Attention mass")
    kept = None
    for ax, press in zip(axes[0, 1:], presses):
        chosen = needle[(needle["press"] == press) & (needle["ratio"] == ratio)]
        kept = layer_head_mesh(ax, grid(chosen, "needle_kept"), f"{press}:\nkept", f"kept:{press}")
    if kept is not None:
        plt.colorbar(kept, ax=axes[0, 1:], fraction=0.04, pad=0.02).set_label("Share of the needle kept")
    figure.suptitle(f"{run.label}: the needle per layer and key/value head at ratio {ratio:g}")
    return figure


def plot_tasks(run: TaskRun, out: str | Path | None = None) -> list[Path]:
    """Write the views into directory `out` (default <run directory>/figures). Returns the paths."""
    folder = plot_folder(run, out)
    paths = style.save(draw_scores(run), folder / "task_scores")
    needle = draw_needle(run)
    if needle is not None:
        paths += style.save(needle, folder / "needle_heatmap")
    for ratio in sorted(set(run.needle["ratio"]) - {0.0}):
        paths += style.save(draw_survival(run, ratio), folder / f"needle_survival_r{ratio:g}")
    return paths
