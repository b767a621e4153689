"""The task study's score figure (`spectra evaluate --plot`'s task_scores): per task, the mean score of each press
against the share of the context cache's bytes it stores (the ratio, for runs before bytes were counted), a line per
press from the full cache, 95% intervals.

It is read with every press of the default list (~20): the panels grow with the presses drawn, and one key below
them, as wide as the figure and as tall as its entries, names each press once (each panel's own legend ran into its
neighbours beyond ~4 presses and left matplotlib no room for the axes); the presses drawn side by side because their
points are all the same are named in the key's title, a line per task; the full cache's score is in each panel's
title. Colours and markers are the presses' own (`report.cache.PRESS_STYLES`), the same in every figure.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..cache import FULL_STYLE, PRESS_STYLES, by_bytes, press_style, wrapped, x_axis
from .style import pyplot, title_lines

if TYPE_CHECKING:
    import pandas as pd

#: how far apart (in x, a share of the axis' unit span) the lines of presses with the same points are drawn
DODGE = 0.012
#: a panel's size (inches) with up to `FEW` presses, and what it grows by per press beyond them
PANEL_INCHES, FEW, GROWTH = (4.2, 3.4), 6, (0.06, 0.035)
#: the key's font size (points) and the inches one of its characters takes, for a first guess of its columns
KEY_FONT, KEY_CHARACTER = 8.5, 0.068
#: the inches a key entry's marker and spacing take beside its label
KEY_HANDLE = 0.55


def coinciding(points: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[list[str]]:
    """The groups (two presses or more, in the run's order) whose drawn points (x, y) are all the same: one line
    would hide the others (adakv(snapkv) behind snapkv, kivi4 behind decoding(knorm))."""
    groups: list[list[str]] = []
    for press, (x, y) in points.items():
        for group in groups:
            other_x, other_y = points[group[0]]
            if len(x) == len(other_x) and np.allclose(x, other_x, rtol=0, atol=1e-9) and np.array_equal(y, other_y):
                group.append(press)
                break
        else:
            groups.append([press])
    return [group for group in groups if len(group) > 1]


def panel_inches(presses: int) -> tuple[float, float]:
    """A panel's (width, height) in inches for `presses` lines: more lines need more room to be told apart."""
    beyond = max(0, presses - FEW)
    return PANEL_INCHES[0] + GROWTH[0] * beyond, PANEL_INCHES[1] + GROWTH[1] * beyond


def styles(presses: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Each press's (colour, marker): its own, or the next spare for a press `PRESS_STYLES` does not list (counted
    over those presses only, so two of them never share one while spares remain)."""
    unknown = [press for press in presses if press not in PRESS_STYLES and wrapped(press) not in PRESS_STYLES]
    return {press: press_style(press, unknown.index(press) if press in unknown else 0) for press in presses}


def draw_task_scores(scores: pd.DataFrame, presses: Sequence[str], once: Sequence[str], title: str):
    """The figure of `scores` (task_scores.csv) for `presses` in the run's order, those of `once` (the same at every
    ratio) as one point each, under `title`. Lines carry gids "score:<task>:<press>", the full cache's "full:<task>"."""
    plt = pyplot()
    tasks = list(dict.fromkeys(scores["task"]))
    rows = -(-len(tasks) // 3)
    columns = -(-len(tasks) // rows)  # at most 3 a row, rows filled evenly (4 tasks: 2 × 2, not 3 + 1)
    width, height = panel_inches(len(presses))
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows + 0.5), squeeze=False,
                                layout="constrained")
    bytes_axis = by_bytes(scores)
    x_column, x_full = ("bytes_share", 1.0) if bytes_axis else ("ratio", 0.0)
    style_of = styles(presses)
    notes: dict[str, list[str]] = {}  # the same scores' groups, written once, → the tasks they hold in
    for ax, task in zip(axes.flat, tasks):
        mine = scores[scores["task"] == task]
        full = mine[mine["press"] == "full"].iloc[0]
        lines = {press: mine[mine["press"] == press].sort_values("ratio").iloc[:1 if press in once else None]
                 for press in presses}
        same = coinciding({press: (line[x_column].to_numpy(float), line["score"].to_numpy(float))
                           for press, line in lines.items()})
        shift = {press: DODGE * (place - (len(group) - 1) / 2) for group in same for place, press in enumerate(group)}
        for press in presses:
            line, alone = lines[press], press in once
            if not len(line):
                continue
            color, marker = style_of[press]
            start = [] if alone else [x_full]
            ratios = np.r_[start, line[x_column].to_numpy(float) + shift.get(press, 0.0)]
            values = np.r_[[full["score"]] * len(start), line["score"]]
            low = np.r_[[full["low"]] * len(start), line["low"]]
            high = np.r_[[full["high"]] * len(start), line["high"]]
            drawn = ax.errorbar(ratios, values, yerr=[values - low, high - values], color=color, marker=marker,
                                markersize=6 if alone else 4.5, linewidth=1.2, capsize=2, zorder=3,
                                linestyle="none" if alone else "--" if wrapped(press) else "-",
                                label=f"{press} (any ratio)" if alone else press)
            drawn.lines[0].set_gid(f"score:{task}:{press}")
            for bars in drawn.lines[2]:  # the intervals lighter than the lines, so that many presses stay apart
                bars.set_alpha(0.55)
        ax.axhline(full["score"], label="full cache", gid=f"full:{task}", zorder=1, **FULL_STYLE)
        ax.set_title(f"{task} ({int(full['examples'])} examples; full cache {full['score']:.2f})")
        x_axis(ax, bytes_axis)
        ax.set_ylabel("Mean score")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.25, linewidth=0.6)
        if same:
            notes.setdefault("; ".join(" = ".join(group) for group in same), []).append(task)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    figure.suptitle(title_lines(title, int(figure.get_figwidth() / 0.09)))
    handles: dict[str, object] = {}
    for ax in axes.flat[:len(tasks)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    full_first = ["full cache", *[label for label in handles if label != "full cache"]]
    key_below(figure, [handles[label] for label in full_first], full_first, same_notes(notes, len(tasks)))
    return figure


def same_notes(notes: dict[str, list[str]], tasks: int) -> list[str]:
    """The key's title: under a heading, each set of presses drawn side by side (the same scores) once, after the
    tasks where they are ("every task" where they are in all of several); none without such presses."""
    if not notes:
        return []
    return ["side by side, the same scores:", *[f"{'every task' if len(held) == tasks > 1 else ', '.join(held)}: "
                                                f"{groups}" for groups, held in notes.items()]]


def key_below(figure, handles: list, labels: list[str], notes: list[str]):
    """One key for every panel, below them: as many balanced columns as the figure's width holds, `notes` (lines
    wrapped to that width) as its title; the figure grows by the key's height, so the panels keep theirs."""
    renderer = figure.canvas.get_renderer()
    room = figure.get_figwidth()
    longest = max(len(label) for label in labels)
    columns = max(1, min(len(labels), int(room // (longest * KEY_CHARACTER + KEY_HANDLE))))
    characters = max(20, int(room / KEY_CHARACTER))
    while True:
        columns = math.ceil(len(labels) / math.ceil(len(labels) / columns))  # balanced: no near-empty last column
        title = "\n".join(textwrap.fill(note, characters, break_long_words=False, subsequent_indent="    ")
                          for note in notes) or None
        key = figure.legend(handles, labels, loc="outside lower center", ncols=columns, frameon=False,
                            fontsize=KEY_FONT, title=title, title_fontsize=KEY_FONT, alignment="left",
                            handlelength=2.2, columnspacing=1.4)
        inches = key.get_window_extent(renderer).width / figure.dpi
        wide = key.get_title().get_window_extent(renderer).width / figure.dpi if title else 0.0
        if inches <= room or (columns == 1 and characters <= 20):
            break
        key.remove()
        if wide > room:
            characters = max(20, int(characters * room / wide) - 2)
        else:
            columns = max(1, columns - 1)
    key.set_gid("key")
    figure.set_figheight(figure.get_figheight() + key.get_window_extent(renderer).height / figure.dpi + 0.15)
    return key
