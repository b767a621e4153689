"""The renderers of docs/leaderboard.md's two comparisons of set-ups: what the haystack does to the board (the same
needles in RULER's noise and in prose) and what compressing once for many questions costs (KVzip's comparison: the
question in view against one compression for every question).

Both read pairs of task runs of the same needles and compare them example by example (`spectra.report.arms`,
`spectra.report.evaluate.question_drop`), so each difference has a paired interval; the claims the prose makes on
them are decided here, on the runs.
"""

from __future__ import annotations

import pandas as pd

from readme_values import RenderError, Runs, table, two
from slots import Rendered
from spectra.errors import SpectraError
from spectra.kv.tasks.haystack import NOISE_NAME
from spectra.report import evaluate, leaderboard
from spectra.report.arms import compared, ranked
from spectra.report.evaluate import TaskRun, question_drop
from spectra.report.haystacks import ARMS, paired
from spectra.report.markdown import interval, with_interval
from spectra.report.survival import reference_in

#: a drop (in view − once) the prose calls small: a tenth of the questions
SMALL = 0.1
#: the presses that keep unusual or large keys, which the prose says RULER's repeated sentence flatters
UNUSUAL_KEYS = ("kvpress:keydiff", "kvpress:knorm", "kvpress:adakv_compactor")


def signed(cell: pd.Series, column: str) -> str:
    """A cell's paired difference `column` with its interval (`column`_low, `column`_high): '+0.12 [+0.05, +0.20]'."""
    return evaluate.with_interval(cell[column], cell[f"{column}_low"], cell[f"{column}_high"], sign="+")


def task_runs(runs: Runs) -> list[TaskRun]:
    found = [run for run in runs.get("evaluate", []) if isinstance(run, TaskRun)]
    if not found:
        raise RenderError("the block must run `spectra evaluate` on task files")
    return found


def reads_noise(run: TaskRun) -> bool:
    """Whether every essay task of the run read RULER's noise sentence (run.json `haystacks`)."""
    read = [entry["name"] for entry in run.meta.get("haystacks") or [] if entry.get("tasks")]
    return bool(read) and all(name == NOISE_NAME for name in read)


def paired_table(cells: pd.DataFrame, first: str, second: str, joiner: str, delta: str) -> str:
    """One row per press (the full cache, where present, at ratio 0 in every column) and one column per ratio:
    `first` `joiner` `second` and the paired difference `delta` with its interval."""
    ratios = sorted(cells.loc[cells["press"] != "full", "ratio"].unique())
    rows = []
    for press, mine in cells.groupby("press", sort=False):
        row = [f"`{press}`" if press != "full" else "full cache"]
        for ratio in ratios:
            cell = mine[mine["ratio"] == (0.0 if press == "full" else ratio)].iloc[0]
            row.append(f"{two(cell[first])} {joiner} {two(cell[second])} ({signed(cell, delta)})")
        rows.append(row)
    return table(["press", *(f"r = {ratio:g}" for ratio in ratios)], rows)


def leaderboard_haystacks(runs: Runs) -> Rendered:
    """Noise against prose on the board's essay tasks: per press and ratio both scores and the paired difference,
    each haystack's ranking and Kendall's τ between them; claims on the full cache, SnapKV and the presses that keep
    unusual or large keys."""
    found = task_runs(runs)
    noise, prose = [run for run in found if reads_noise(run)], [run for run in found if not reads_noise(run)]
    if not noise or not prose:
        raise RenderError("the block must run one task file whose essay tasks read --haystack noise and one that "
                          "reads prose")
    try:
        rows = paired(noise, prose)
    except SpectraError as error:
        raise RenderError(str(error)) from None
    seed = leaderboard.seed_of(noise)
    cells, (order, tau) = compared(rows, seed, ARMS), ranked(rows, seed, ARMS)
    full = cells[cells["press"] == "full"].iloc[0]
    ranks = table(["press", "mean over r, noise", "rank, noise", "mean over r, prose", "rank, prose"],
                  [[f"`{row.press}`", two(row.noise_score), str(row.noise_rank), two(row.prose_score),
                    str(row.prose_rank)] for row in order.itertuples()])
    by_press = order.set_index("press")
    if (named := reference_in(by_press.index)) not in by_press.index:
        raise RenderError(f"the runs lack {named}, whose scores the paragraph quotes: run it in both arms")
    reference = by_press.loc[named]
    unusual = [press for press in UNUSUAL_KEYS if press in set(cells["press"])]
    flattered = [press for press in unusual if cells.loc[cells["press"] == press, "delta"].mean() < 0]
    below = cells[(cells["press"] != "full") & (cells["delta_high"] < 0)]
    above = cells[(cells["press"] != "full") & (cells["delta_low"] > 0)]
    values = {"examples": str(int(cells["examples"].iloc[0])),
              "tasks": ", ".join(f"`{task}`" for task in dict.fromkeys(rows["task"])),
              "full_noise": with_interval(full["noise"], full["noise_low"], full["noise_high"]),
              "full_prose": with_interval(full["prose"], full["prose_low"], full["prose_high"]),
              "table": paired_table(cells, "noise", "prose", "→", "delta"),
              "ranks": ranks, "tau": two(tau["tau"]), "tau_interval": interval(tau["low"], tau["high"]),
              "cells": str(len(cells) - 1), "lower_on_prose": str(len(below)), "higher_on_prose": str(len(above)),
              "reference_noise": two(reference["noise_score"]), "reference_prose": two(reference["prose_score"]),
              "flattered": ", ".join(f"`{press}`" for press in flattered) or "none"}
    claims = {"ranking-changes": tau["low"] < 1 and tau["tau"] < 1,
              "ranking-related": tau["low"] > 0,
              "reference-low-on-both": bool(max(reference["noise_score"], reference["prose_score"]) < 0.25),
              "noise-flatters-unusual-keys": len(flattered) == len(unusual) > 0,
              "more-cells-lower-on-prose": len(below) > len(above)}
    return Rendered(values, claims)


def leaderboard_in_view(runs: Runs) -> Rendered:
    """KVzip's comparison measured: per press and ratio the score with the question in view (a --query-aware run,
    one compression per question) beside the score from one compression answering every question, with the paired
    drop; the largest drop, the cells that do better once, and claims on them (no correction over the cells: the
    prose quotes intervals, it does not count tests that pass)."""
    found = task_runs(runs)
    in_view = [run for run in found if run.meta.get("query_aware")]
    once = [run for run in found if not run.meta.get("query_aware")]
    if len(in_view) != 1 or len(once) != 1:
        raise RenderError("the block must run one task file of several questions a record twice, --query-aware and "
                          f"not, got {len(in_view)} and {len(once)}")
    try:
        drop = question_drop(in_view[0], once[0])
    except SpectraError as error:
        raise RenderError(str(error)) from None
    full_drop = drop[drop["press"] == "full"].iloc[0]
    drop = drop[drop["press"] != "full"]
    largest = drop.loc[drop["drop"].idxmax()]
    better = drop[drop["drop_high"] < 0]  # cells that answer more from one compression than with the question in view
    full = once[0].examples
    full = full[full["press"] == "full"]
    values = {"questions": str(int(drop["questions"].max())), "records": str(full["example"].nunique()),
              "tasks": ", ".join(f"`{task}`" for task in dict.fromkeys(drop["task"])),
              "length": str(int(full["length"].max())), "full_in_view": two(full_drop["in_view"]),
              "full_once": two(full_drop["once"]),
              "table": paired_table(drop, "in_view", "once", "/", "drop"),
              "largest_drop": signed(largest, "drop"),
              "largest_at": f"`{largest['press']}` at r = {largest['ratio']:g}",
              "better_once": ", ".join(f"`{row.press}` at r = {row.ratio:g} ({two(row.in_view)} in view, "
                                       f"{two(row.once)} once)" for row in better.itertuples()) or "none"}
    claims = {"once-costs-little": bool(largest["drop"] < SMALL), "some-better-once": bool(len(better)),
              "reference-gains-little-in-view": bool((drop.loc[drop["press"] == reference_in(drop["press"]), "drop"]
                                                      < SMALL).all())}
    return Rendered(values, claims)
