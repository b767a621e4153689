"""What every figure shares: pyplot setup, saving, loading the runs to draw, the heatmap, method colours and
markers, the log axes (with ▼ marks for values under them), the k axis and the legends.

matplotlib is imported inside the functions (through `pyplot`), so importing the figure modules stays cheap
and a headless machine never needs a display.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import SpectraError
from ...runs import FinishedRun

DPI = 200
HEATMAP_CMAP = "viridis"  # sequential, perceptually uniform, readable in grey
#: the colour map of attention mass beside a heatmap of shares (the needle survival picture): another quantity on
#: another scale, so another colour map (sequential, readable in grey too)
ATTENTION_CMAP = "Oranges"
FORMATS = ("png", "pdf")


#: the colour map of layer depth (analyze and scaling figures)
DEPTH_CMAP = "viridis"


def pyplot():
    """matplotlib.pyplot on the Agg backend, with the package's font sizes and embeddable (Type 42) PDF fonts."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10.5, "legend.fontsize": 8.5, "pdf.fonttype": 42})
    return plt


# ---------------------------------------------------------------- where figures go, which runs they draw


def output_paths(out: str | Path) -> dict[str, Path]:
    """`out` with each format's suffix; a given .png/.pdf suffix is dropped first."""
    out = Path(out)
    if out.suffix.lower() in {f".{fmt}" for fmt in FORMATS}:
        out = out.with_suffix("")
    if out.exists() and out.is_dir():
        raise SpectraError(f"--out {out} is a directory; give a file name without suffix, e.g. {out / 'figure1'}")
    return {fmt: out.with_name(out.name + f".{fmt}") for fmt in FORMATS}


def save(figure, out: str | Path) -> list[Path]:
    """Write the figure as PNG (200 dpi) and PDF; returns the paths.

    Every `plot_*` entry point saves through `style.save` (looked up on this module), so a test can record
    the figures by patching this one name.
    """
    plt = pyplot()
    paths = output_paths(out)
    paths["png"].parent.mkdir(parents=True, exist_ok=True)
    try:
        for fmt, path in paths.items():
            figure.savefig(path, dpi=DPI if fmt == "png" else None, bbox_inches="tight")
    finally:
        plt.close(figure)
    return list(paths.values())


def default_plot_dir(run: FinishedRun) -> Path:
    """<run directory>/figures: where a run's views go unless told otherwise, beside the numbers they draw (never
    into a folder of the current directory, such as a clone's tracked figures/)."""
    return Path(run.path) / "figures"


def plot_folder(run: FinishedRun, out: str | Path | None) -> Path:
    """The directory for a run's views: `out`, or `default_plot_dir`; an existing file there is an error."""
    folder = Path(out) if out is not None else default_plot_dir(run)
    if folder.exists() and not folder.is_dir():
        raise SpectraError(f"--out {folder} exists and is not a directory; give a directory for the figures")
    return folder


def subtitle(run: FinishedRun, n: int) -> str:
    """"<model> · <data>, n = <n>, <samples> sequences": the second line of a view's title. A run with a
    calibration counts the sequences its numbers are measured on, and says how many calibrated."""
    samples, evaluation = run.meta.get("samples"), run.meta.get("evaluation")
    if evaluation:
        return f"{run.label}, n = {n}, {samples} held-out sequences ({evaluation[0]} calibrated)"
    return f"{run.label}, n = {n}" + (f", {samples} sequences" if samples else "")


# ---------------------------------------------------------------- heatmaps and ticks


def ticks(count: int, most: int = 16) -> np.ndarray:
    """0-based tick positions, thinned so at most about `most` labels show."""
    step = max(1, math.ceil(count / most))
    return np.arange(0, count, step)


def title_lines(text: str, width: int) -> str:
    """`text` with every line longer than `width` characters broken at spaces (words kept whole), so a long title
    stays over its figure instead of running off its edges."""
    return "\n".join(textwrap.fill(line, width, break_long_words=False) or line for line in text.splitlines())


#: the characters of a press's name a panel's title holds on one line, and the inches one character takes there
PANEL_CHARACTERS, INCHES_PER_CHARACTER = 18, 0.085


def press_label(press: str, width: int = PANEL_CHARACTERS) -> str:
    """A press's name for a panel title: the folders of a path argument dropped (`kvzap(artifacts/kvzap-mlp)` →
    `kvzap(kvzap-mlp)`) and, where still longer than `width` characters, its argument on a line of its own
    (`criticaladakv` / `(expected_attention)`): the full names stand in the tables beside the picture."""
    short = re.sub(r"([(,])[^(),]*/", r"\1", press)
    if len(short) <= width or "(" not in short:
        return short
    name, argument = short.split("(", 1)
    return f"{name}\n({argument}"


def label_inches(labels: Sequence[str]) -> float:
    """The width in inches that the longest line of `labels` takes in a panel's title."""
    return INCHES_PER_CHARACTER * max([len(line) for label in labels for line in label.splitlines()], default=0)


def index_ticks(n: int) -> list[float]:
    """Ticks at 0, n/4 and n (the paper's 0, 128, 512)."""
    return sorted({0.0, n / 4, float(n)})


def draw_heatmap(ax, values: np.ndarray, *, title: str, colorbar: str, digits: int | None = None):
    """Layer index down, head index across, sequential colours and a colour bar; `digits` annotates cells."""
    plt = pyplot()
    values = np.asarray(values, dtype=float)
    layers, heads = values.shape
    # pcolormesh, not imshow: the PDF gets one vector cell per (layer, head), never a resampled bitmap
    image = ax.pcolormesh(np.arange(heads + 1) - 0.5, np.arange(layers + 1) - 0.5, values, cmap=HEATMAP_CMAP,
                          shading="flat", edgecolors="face", linewidth=0.0)
    ax.set_xlim(-0.5, heads - 0.5)
    ax.set_ylim(layers - 0.5, -0.5)  # layer 0 on top, as in the paper
    ax.set_xticks(ticks(heads))
    ax.set_yticks(ticks(layers))
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


# ---------------------------------------------------------------- methods: colours, markers, axes


#: colour and marker of labels the method registry does not know (Theorem 2's δ variants); registered
#: methods take theirs from `spectra.methods.REGISTRY`, the same in every figure
OTHER_STYLES: dict[str, tuple[str, str]] = {
    "theorem2(delta=1/2^n)": ("tab:red", "<"),
    "theorem2(delta=1/n)": ("tab:brown", ">"),
}
SPARE_MARKERS = "os^vDPX*<>hpd"
EXACT_STYLE = dict(color="0.3", linestyle="--", linewidth=1.1, zorder=1)


def method_style(label: str, index: int = 0) -> dict:
    """Line keyword arguments for a method label: the registry's colour and marker (else `OTHER_STYLES`, else
    the `index`-th spare), dashed for Theorem 2's δ variants."""
    plt = pyplot()
    from ...methods import REGISTRY  # imports torch: only when a method is drawn

    if label in REGISTRY:
        color, marker = REGISTRY[label].color, REGISTRY[label].marker
    elif label in OTHER_STYLES:
        color, marker = OTHER_STYLES[label]
    else:
        color, marker = plt.get_cmap("tab20").colors[(2 * index + 1) % 20], SPARE_MARKERS[index % len(SPARE_MARKERS)]
    dashed = label.startswith("theorem2(")
    return dict(color=color, marker=marker, markersize=5, linewidth=1.5, linestyle="--" if dashed else "-")


def k_axis(ax, budgets: Sequence[int], label: str = "Projected dimension k") -> tuple[float, float]:
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


def log_y(axes: Sequence, decades: float = 5.0) -> bool:
    """One log y range for `axes` (shared axes agree), at most `decades` decades below the largest value.

    Values under the bottom — an exact method (svd or pooling at k = n) gives 0 or float round-off — keep
    their stored value in the line and get a ▼ on the bottom edge (gid "below:<line gid>"). True if any do.
    """
    from matplotlib.ticker import LogLocator, NullFormatter

    lines = [line for ax in axes for line in ax.get_lines()]
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in lines] or [np.zeros(0)])
    positive = values[np.isfinite(values) & (values > 0)]
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
        below |= mark_below(ax, bottom)
    return below


def plain_log_ticks(ax) -> None:
    """Label a log y axis (of counts such as ranks) with plain numbers — 60, not matplotlib's 6×10¹ — at every
    decade and, on a range of under two decades, at 2, 3 and 5 times each (under a factor of 4, at every integer
    multiple, so a narrow range still gets labels); minor ticks between the labels stay unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    low, high = ax.get_ylim()
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(plain)
    ratio = high / low if low > 0 else float("inf")
    if ratio < 100:
        subs = tuple(float(i) for i in range(2, 10)) if ratio < 4 else (2.0, 3.0, 5.0)
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=subs))
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())


def maybe_log_y(ax, ratio: float = 5.0) -> bool:
    """Log y (see `log_y`) when the positive values drawn span more than `ratio`, else linear with a grid."""
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()])
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() / values.min() > ratio:
        return log_y([ax])
    ax.grid(alpha=0.25, linewidth=0.6)
    return False


def mark_below(ax, bottom: float) -> bool:
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


# ---------------------------------------------------------------- legends


def below_entry(handles: list, labels: list, below: bool) -> tuple[list, list]:
    """The legend entry explaining ▼ marks, when there are any."""
    if below:
        from matplotlib.lines import Line2D

        handles = [*handles, Line2D([], [], color="0.3", marker="v", markersize=6, linestyle="none")]
        labels = [*labels, "below the axis (≈ 0: exact)"]
    return handles, labels


def outside_legend(figure, handles, labels, title: str | None = None) -> None:
    """One legend for the whole figure, right of the panels, so it never covers data (figures with an axis title;
    centred in height, so a title wider than its axes does not run into it)."""
    figure.legend(handles, labels, loc="outside right center", frameon=False, title=title, alignment="left")


def bottom_legend(figure, handles, labels) -> None:
    """One legend below the panels, in as many columns as the width holds (figures with a suptitle on top)."""
    columns = max(1, min(len(labels), int(figure.get_figwidth() / 2.0)))
    figure.legend(handles, labels, loc="outside lower center", ncols=columns, frameon=False)


def label_heights(x: Sequence[float], y: Sequence[float], widths: Sequence[float], height: float) -> np.ndarray:
    """Where each point's label sits, in data units, so that no two labels overlap: each label is a box `widths[i]`
    wide and `height` tall starting at its point, placed from the lowest point up and raised above every box placed
    before it that it would overlap. A scatter of presses crowds where scores tie; raised labels keep every name
    legible (a line joins a raised label to its point)."""
    placed: list[tuple[float, float, float]] = []  # (left, right, bottom) of each box placed
    heights = np.asarray(y, dtype=float).copy()
    for index in np.argsort(heights, kind="stable"):
        left, right, bottom = float(x[index]), float(x[index]) + float(widths[index]), float(heights[index])
        moved = True
        while moved:
            moved = False
            for other_left, other_right, other_bottom in placed:
                if left < other_right and other_left < right and abs(bottom - other_bottom) < height - 1e-12:
                    bottom, moved = other_bottom + height, True
        heights[index] = bottom
        placed.append((left, right, bottom))
    return heights

