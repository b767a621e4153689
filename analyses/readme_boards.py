"""The renderer of docs/leaderboard.md's comparison of set-ups: what the haystack does to the board, the same needles
in RULER's noise and in prose.

It reads the task runs of both arms and compares them needle by needle (`spectra.report.haystacks`,
`spectra.report.arms`), so each difference has a paired interval; the claims the prose makes on them are decided
here, on the runs.
"""

from __future__ import annotations

import pandas as pd

from readme_values import RenderError, Runs, table, two
from slots import Rendered
from spectra.errors import SpectraError
from spectra.kv.tasks.haystack import NOISE_NAME
from spectra.report import leaderboard
from spectra.report.arms import compared, ranked
from spectra.report.evaluate import TaskRun
from spectra.report.haystacks import ARMS, paired
from spectra.report.markdown import interval, with_interval
from spectra.report.survival import reference_in

#: the presses that keep unusual or large keys, which the prose says RULER's repeated sentence flatters
UNUSUAL_KEYS = ("kvpress:keydiff", "kvpress:knorm", "kvpress:adakv_compactor")


def signed(value: float, low: float, high: float) -> str:
    """A paired difference with its interval, '+0.12 [+0.05, +0.20]'."""
    return f"{value:+.2f} [{low:+.2f}, {high:+.2f}]"


def task_runs(runs: Runs) -> list[TaskRun]:
    found = [run for run in runs.get("evaluate", []) if isinstance(run, TaskRun)]
    if not found:
        raise RenderError("the block must run `spectra evaluate` on task files")
    return found


def reads_noise(run: TaskRun) -> bool:
    """Whether every essay task of the run read RULER's noise sentence (run.json `haystacks`)."""
    read = [entry["name"] for entry in run.meta.get("haystacks") or [] if entry.get("tasks")]
    return bool(read) and all(name == NOISE_NAME for name in read)


def haystack_rows(cells: pd.DataFrame) -> list[list[str]]:
    """One row per press (the full cache first): at each ratio noise → prose and the paired difference."""
    rows = []
    ratios = sorted(cells.loc[cells["press"] != "full", "ratio"].unique())
    for press, mine in cells.groupby("press", sort=False):
        row = [f"`{press}`" if press != "full" else "full cache"]
        for ratio in ratios:
            cell = mine[mine["ratio"] == (0.0 if press == "full" else ratio)].iloc[0]
            row.append(f"{two(cell['noise'])} → {two(cell['prose'])} "
                       f"({signed(cell['delta'], cell['delta_low'], cell['delta_high'])})")
        rows.append(row)
    return rows


def mean_delta(cells: pd.DataFrame, press: str) -> tuple[float, float, float]:
    """A press's paired differences prose − noise at its ratios: (mean, smallest low end, largest high end)."""
    mine = cells[cells["press"] == press]
    return float(mine["delta"].mean()), float(mine["delta_low"].min()), float(mine["delta_high"].max())


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
    ratios = sorted(cells.loc[cells["press"] != "full", "ratio"].unique())
    full = cells[cells["press"] == "full"].iloc[0]
    ranks = table(["press", "mean over r, noise", "rank, noise", "mean over r, prose", "rank, prose"],
                  [[f"`{row.press}`", two(row.noise_score), str(row.noise_rank), two(row.prose_score),
                    str(row.prose_rank)] for row in order.itertuples()])
    by_press = order.set_index("press")
    if (named := reference_in(by_press.index)) not in by_press.index:
        raise RenderError(f"the runs lack {named}, whose scores the paragraph quotes: run it in both arms")
    reference = by_press.loc[named]
    unusual = [press for press in UNUSUAL_KEYS if press in set(cells["press"])]
    flattered = [press for press in unusual if mean_delta(cells, press)[0] < 0]
    below = cells[(cells["press"] != "full") & (cells["delta_high"] < 0)]
    above = cells[(cells["press"] != "full") & (cells["delta_low"] > 0)]
    values = {"examples": str(int(cells["examples"].iloc[0])),
              "tasks": ", ".join(f"`{task}`" for task in dict.fromkeys(rows["task"])),
              "full_noise": with_interval(full["noise"], full["noise_low"], full["noise_high"]),
              "full_prose": with_interval(full["prose"], full["prose_low"], full["prose_high"]),
              "table": table(["press", *(f"r = {ratio:g}" for ratio in ratios)], haystack_rows(cells)),
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

