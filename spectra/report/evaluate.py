"""A run of the task study (`spectra evaluate`, or `spectra cache` on a task file) read back, printed and drawn: the
run object (`load`), the console tables (`show`) and the figures (`plot`) — the read side of `kinds/evaluate.py`,
beside `report/cache.py`'s of the NLL study.

A task run holds `examples` (task_examples.csv: per press, ratio, example and question — the question's 0-based
index within its record, 0 for a record asking one — the prediction and its score, the share of context rows kept,
the share of the needle kept over layers and heads), `scores` (task_scores.csv: per press, ratio and task the mean
score, the full cache's on the same examples, the difference, with bootstrap intervals), `lengths`
(task_lengths.csv: the same per task and length), `needle` (task_needle.csv: per press, ratio, layer and key/value
head the needle kept and the full cache's attention on it) and `evicted` (task_evicted.csv: per example a press
failed — scored below the full cache — the layers where no head kept the needle);
needle.npz holds the per-example arrays. A published folder (`spectra publish`, `report.published`) reads back as
the run, its tables gzipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runs import FinishedRun, read_table
from . import published
from .published import PUBLISHED, SUFFIX, verified
from .cache import by_bytes, once_note, one_row_each, same_at_every_ratio
from .plots import style
from .plots.scores import draw_task_scores
from .plots.style import plot_folder, pyplot

if TYPE_CHECKING:
    import pandas as pd


@dataclass(repr=False)
class TaskRun(FinishedRun):
    """A run of the task study (see the module docstring)."""

    path: Path
    meta: dict[str, Any]
    examples: pd.DataFrame
    scores: pd.DataFrame
    lengths: pd.DataFrame
    needle: pd.DataFrame
    evicted: pd.DataFrame


    def arrays(self) -> dict[str, Any]:
        """needle.npz: survival (cells, examples, layers, key/value heads), mass (examples, layers, key/value heads),
        press, ratio (per cell) and example (line indices); from the run directory or its published folder (one line
        where the run has none)."""
        return published.arrays(self.path, self.meta, "needle.npz")


def load(path: Path, meta: dict[str, Any]) -> TaskRun:
    """A finished task run's tables (predictions kept as text: an answer such as "007" stays a string), from its run
    directory or its published folder (`report.published`: each file's sha256 checked first)."""
    gz = verified(path, meta)
    text = {"prediction": str, "evicted_layers": str, "task": str}
    return TaskRun(path, meta, read_table(path, "task_examples.csv" + gz, dtype=text, keep_default_na=False,
                                          na_values={"depth": [""], "needle_kept": [""]}),
                   read_table(path, "task_scores.csv" + gz, dtype=text),
                   read_table(path, "task_lengths.csv" + gz, dtype=text), read_table(path, "task_needle.csv" + gz),
                   read_table(path, "task_evicted.csv" + gz, dtype=text, keep_default_na=False,
                              na_values={"depth": [""]}))


def needle_vs_score(run: TaskRun) -> pd.DataFrame:
    """Whether keeping the needle predicts answering: per press (and "all"), over its compressed cells with a needle
    on examples the full cache answered (score 1), the cells `answered` (score 1) and `missed`, the mean share of
    the needle kept in each group, and the AUC — the probability that an answered cell kept more of the needle than
    a missed one (ties count half; NaN without both groups)."""
    import numpy as np
    import pandas as pd

    examples = run.examples
    unit = ["example", "question"] if "question" in examples.columns else ["example"]  # runs before questions
    full = examples[examples["press"] == "full"].set_index(unit)["score"]
    cells = examples[(examples["press"] != "full") & examples["needle_kept"].notna()]
    answered = full.reindex(pd.MultiIndex.from_frame(cells[unit]) if len(unit) > 1 else cells["example"])
    cells = cells[answered.to_numpy() == 1]
    rows = []
    for press, group in [*cells.groupby("press", sort=False), ("all", cells)]:
        hit = group[group["score"] == 1]["needle_kept"].to_numpy()
        miss = group[group["score"] < 1]["needle_kept"].to_numpy()
        auc = (float(((hit[:, None] > miss[None]) + 0.5 * (hit[:, None] == miss[None])).mean())
               if hit.size and miss.size else float("nan"))
        rows.append({"press": press, "answered": hit.size, "missed": miss.size,
                     "kept_answered": hit.mean() if hit.size else np.nan,
                     "kept_missed": miss.mean() if miss.size else np.nan, "auc": auc})
    return pd.DataFrame(rows)


#: the per-task table's measured columns, compared across ratios to find a press that ignores the ratio
TASK_VALUES = ["score", "low", "high", "delta", "delta_low", "delta_high", "bytes_share"]


def ratio_free(scores: pd.DataFrame) -> list[str]:
    """The presses the same at every ratio in every task (`cache.same_at_every_ratio`), judged with the bytes each
    cell stored: a run before bytes were counted cannot tell a press that ignores the ratio from one that scored the
    same at each (snapkv, keeping the same few answers), so it names none."""
    if not by_bytes(scores):
        return []
    return same_at_every_ratio(scores, [column for column in TASK_VALUES if column in scores.columns], ("task",))


def with_interval(value: float, low: float, high: float, sign: str = "") -> str:
    """'0.80 [0.50, 1.00]' ('+' as `sign`: '-0.20 [-0.50, +0.00]'); the value alone without an interval."""
    if np.isnan(value):
        return ""
    shown = f"{value:{sign}.2f}"
    return shown if np.isnan(low) or np.isnan(high) else f"{shown} [{low:{sign}.2f}, {high:{sign}.2f}]"


def task_table(scores: pd.DataFrame, once: list[str]) -> pd.DataFrame:
    """One task's rows as printed: the full cache first, then each press (in the run's order) by ratio — one row for
    a press of `once` —, its score and its paired difference from the full cache each with its interval, and the
    share of the context cache's bytes stored (when the run counted bytes)."""
    import pandas as pd

    order = {press: rank for rank, press in enumerate(["full", *presses_of(scores)])}
    rows = scores.sort_values(["press", "ratio"], key=lambda column: column.map(order) if column.name == "press"
                              else column, kind="stable")
    rows = one_row_each(rows, once)
    table = pd.DataFrame({
        "press": rows["press"], "ratio": rows["ratio"],
        "score": [with_interval(*values) for values in zip(rows["score"], rows["low"], rows["high"])],
        "Δ vs full": ["" if press == "full" else with_interval(*values, sign="+")
                      for press, *values in zip(rows["press"], rows["delta"], rows["delta_low"], rows["delta_high"])]})
    if "bytes_share" in rows and rows["bytes_share"].notna().any():
        table["bytes"] = rows["bytes_share"].to_numpy()
    return table


def show(run: TaskRun) -> None:
    """Per task (a table each, narrow enough for 80 columns): the full cache's mean score, then each press's and
    ratio's beside it with the paired difference, intervals in brackets; then whether keeping the needle predicts
    the answer."""
    from .console import out, plural, print_frame

    meta = run.meta
    scores = run.scores
    aware = "context + question compressed" if meta.get("query_aware") else "question appended uncompressed"
    if meta.get("local_layers", "keep") != "keep":  # what the presses did to the sliding-window layers
        aware += f", local layers: {meta['local_layers']} (--local-layers)"
    if meta.get("stop_answered"):  # the stored answers are prefixes, cut where their scores settled
        aware += ", each answer stopped once its score was final (--stop-answered)"
    out.print(f"{run.label}: {plural(meta.get('examples', meta.get('samples', 0)), 'example')}, {aware}. Per task, "
              "the mean score (RULER's string match) of the full cache and of each press and ratio, its paired "
              "difference from the full cache on the same examples (Δ) and the share of the context cache's bytes "
              "it stored; [95% bootstrap interval over examples]")
    once = ratio_free(scores)
    for task, mine in scores.groupby("task", sort=False):
        examples = int(mine[mine["press"] == "full"]["examples"].iloc[0]) if (mine["press"] == "full").any() else 0
        print_frame(task_table(mine, once), f"{task}, {plural(examples, 'example')}", digits={"bytes": 3})
    if once:
        out.print(once_note(once, scores, "task_scores.csv"))
    show_questions(run)
    predicts = needle_vs_score(run)
    if (predicts["answered"] + predicts["missed"]).sum():
        print_frame(predicts, "does keeping the needle predict the answer? compressed cells of examples the full cache "
                    "answered: the needle's share kept (mean over layers and heads) when answered and when missed, "
                    "and the AUC (1: every answered cell kept more of it than every missed one; 0.5: no relation)",
                    digits={"kept_answered": 3, "kept_missed": 3, "auc": 3})
    failed = run.evicted
    if len(failed):
        lost = failed[failed["evicted"] > 0]
        out.print(f"{plural(len(failed), 'cell')} scored below the full cache; in {len(lost)} of them some layer's "
                  f"heads all evicted the needle (task_evicted.csv)")
    left_out = meta.get("data", {}).get("tasks_left_out") if isinstance(meta.get("data"), dict) else None
    if left_out:
        out.print(f"--samples left out every record of {', '.join(left_out)}: without it the whole file runs")


def question_drop(in_view: TaskRun, once: TaskRun) -> pd.DataFrame:
    """The drop KVzip reports, measured (`kv.tasks.summary.question_drop`): per press, ratio and task, the score with
    the question in view (`in_view`: a --query-aware run, one compression per question) beside the score from one
    query-agnostic compression answering every question of a record (`once`), over the questions both runs asked. Two
    runs of the same task file are required, the first query-aware and the second not (one line otherwise)."""
    from ..errors import SpectraError
    from ..kv.tasks.summary import question_drop as drop

    if not in_view.meta.get("query_aware") or once.meta.get("query_aware"):
        raise SpectraError(f"the question drop compares a --query-aware run ({in_view.label} is "
                           f"{'' if in_view.meta.get('query_aware') else 'not '}one) with a query-agnostic run of the "
                           f"same task file ({once.label} is {'' if once.meta.get('query_aware') else 'not '}one): "
                           "give them in that order")
    files = [run.meta.get("data", {}).get("sha256") for run in (in_view, once)]
    if files[0] != files[1] or "question" not in once.examples:
        raise SpectraError(f"{in_view.label} and {once.label} ran different task files (or a run before records "
                           "asked several questions): the drop pairs the same questions of the same records")
    return drop(in_view.examples, once.examples, int(once.meta.get("settings", {}).get("seed", 0)))


def show_questions(run: TaskRun) -> None:
    """Per task and question index, each press's score beside the full cache's (task_questions.csv), for a run whose
    records ask several questions; nothing otherwise."""
    from .console import print_frame
    from ..runs import read_table

    name = "task_questions.csv" + (SUFFIX if PUBLISHED in run.meta else "")  # checked when the run loaded
    if not (run.path / name).exists():
        return
    table = read_table(run.path, name, dtype={"task": str})
    for task, mine in table.groupby("task", sort=False):
        shown = mine[["press", "ratio", "question", "examples", "score", "delta"]]
        print_frame(shown, f"{task}: per question (its index in the record), the mean score over the records asking "
                    "it and Δ vs the full cache (task_questions.csv has the intervals)",
                    digits={"ratio": 2, "score": 2, "delta": 2})


def presses_of(table) -> list[str]:
    """The compressing presses of a table, in the run's order."""
    return [press for press in dict.fromkeys(table["press"]) if press != "full"]


def draw_scores(run: TaskRun):
    """Score per task against the share of the context cache's bytes stored (the ratio for runs before bytes were
    counted), a line per press from the full cache, 95% intervals (`plots.scores`: one key below the panels, a press
    the same at every ratio one point, presses with the same points side by side)."""
    scores = run.scores
    against = "the share of the cache's bytes stored" if by_bytes(scores) else "the ratio removed"
    return draw_task_scores(scores, presses_of(scores), ratio_free(scores),
                            f"{run.label}: score per task against {against} (95% bootstrap intervals)")


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
    once = set(ratio_free(run.scores))  # the same at every ratio: one panel, at its first ratio, named "any ratio"
    figure, axes = plt.subplots(len(presses) + 1, max(1, len(ratios)), squeeze=False, layout="constrained",
                                figsize=(2.3 * max(1, len(ratios)) + 1.2, 1.9 * (len(presses) + 1) + 0.6))
    image = None
    for row, press in enumerate(["full", *presses]):
        for column, ratio in enumerate(ratios or [0.0]):
            ax = axes[row, column]
            key = ("full", 0.0) if press == "full" else (press, ratio)
            values = grids.get(key)
            if (press == "full" or press in once) and column > 0 or values is None:
                ax.set_visible(False)
                continue
            image = ax.pcolormesh(np.arange(len(lengths) + 1) - 0.5, np.arange(len(depths) + 1) - 0.5, values,
                                  cmap=style.HEATMAP_CMAP, vmin=0, vmax=1, shading="flat",
                                  gid=f"needle:{key[0]}:{key[1]}")
            ax.set_ylim(len(depths) - 0.5, -0.5)
            ax.set_xticks(range(len(lengths)), [str(int(length)) for length in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{depth:.2f}" for depth in depths], fontsize=7)
            ax.set_title("full cache" if press == "full" else f"{press}, any ratio" if press in once else
                         f"{press}, ratio {ratio:g}", fontsize=8.5)
            if column == 0:
                ax.set_ylabel("Needle depth")
            if row == len(presses):
                ax.set_xlabel("Length (tokens)")
    if image is not None:  # one scale for every panel: a bar as tall as the grid (at matplotlib's default aspect it
        # was a short bar beside the middle row, read as that row's own)
        shown = [ax for ax in axes.flat if ax.get_visible()]
        bar = figure.colorbar(image, ax=shown, fraction=0.03, pad=0.02, aspect=16 * (len(presses) + 1))
        bar.set_label("Mean score")
        bar.ax.set_gid("colorbar")
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


#: the panels a row of the survival picture holds (the full cache's and 7 presses'); more presses take more rows
SURVIVAL_ROW = 8


def draw_survival(run: TaskRun, ratio: float):
    """The needle kept per layer and key/value head by each press at `ratio` (one scale, 0 to 1), and the full
    cache's attention mass of the question on it: another quantity, on its own scale and colour map
    (`style.ATTENTION_CMAP`), each colour bar naming its quantity and range; rows of `SURVIVAL_ROW` panels."""
    plt = pyplot()
    needle = run.needle
    heads = int(needle["head"].max()) + 1
    layers = int(needle["layer"].max()) + 1
    presses = [press for press in presses_of(needle)
               if needle[(needle["press"] == press) & (needle["ratio"] == ratio)]["needle_kept"].notna().any()]
    panels = len(presses) + 1
    columns = min(panels, SURVIVAL_ROW)
    rows = -(-panels // columns)
    labels = {press: style.press_label(press) for press in presses}
    panel = max(1.5 * max(1.0, heads / 4), style.label_inches(list(labels.values())))  # as wide as its title
    figure, axes = plt.subplots(rows, columns, figsize=(panel * columns + 2.4, 5.4 * rows), squeeze=False,
                                layout="constrained", sharey=True)
    flat = list(axes.flat)

    def grid(frame, column):
        return frame.sort_values(["layer", "head"])[column].to_numpy().reshape(layers, heads)

    full = grid(needle[needle["press"] == "full"], "needle_mass")
    mass = layer_head_mesh(flat[0], full, "full cache:\nattention on it", "mass", None)
    mass.set_cmap(style.ATTENTION_CMAP)
    plt.colorbar(mass, ax=flat[0], location="left", fraction=0.12, pad=0.08, aspect=45).set_label(
        f"Full cache's attention mass on the needle (0 to {np.nanmax(full):.2g})")
    kept = None
    for ax, press in zip(flat[1:], presses):
        chosen = needle[(needle["press"] == press) & (needle["ratio"] == ratio)]
        kept = layer_head_mesh(ax, grid(chosen, "needle_kept"), f"{labels[press]}:\nkept", f"kept:{press}")
    for ax in flat[panels:]:
        ax.set_visible(False)
    for ax in flat[::columns]:
        ax.set_ylabel("Layer")
    if kept is not None:
        plt.colorbar(kept, ax=flat[1:panels], fraction=0.04 / rows, pad=0.02, aspect=20 * (2 * rows - 1)).set_label(
            f"Share of the needle kept at r = {ratio:g} (0 to 1)")
    figure.suptitle(f"{run.label}: the needle per layer and key/value head at ratio {ratio:g}")
    return figure


def plot(run: TaskRun, out: str | Path | None = None) -> list[Path]:
    """Write the views into directory `out` (default <run directory>/figures). Returns the paths."""
    folder = plot_folder(run, out)
    paths = style.save(draw_scores(run), folder / "task_scores")
    needle = draw_needle(run)
    if needle is not None:
        paths += style.save(needle, folder / "needle_heatmap")
    for ratio in sorted(set(run.needle["ratio"]) - {0.0}):
        paths += style.save(draw_survival(run, ratio), folder / f"needle_survival_r{ratio:g}")
    return paths
