"""The renderers of docs/cache.md's long-context task paragraphs: the story against NLL and its detail (the front
page's headline is a report page's, `spectra.pages.task_scores`, whose helpers these share).

A task run of `spectra cache` (a task file made by `spectra tasks`) scores each press by the answers decoded from its
compressed cache; the full cache's score on the same examples is the baseline. A task whose baseline fails (the model
cannot answer it even with its whole cache) says nothing about a press, so these renderers quote a press's score only
on the tasks where the full cache answers at least `HOLDS` of the examples, and say which tasks they left out. The
NLL run beside (the licence text's continuation) is read at the same ratios, so the two metrics' rankings of the
presses can be set side by side.
"""

from __future__ import annotations

import pandas as pd

from readme_values import RenderError, Runs, listed, slashed, table, two
from slots import Rendered
from spectra.pages.task_scores import HALF, compressing, full_scores, held, press_scores, ratios_of
from spectra.report.evaluate import TaskRun, needle_vs_score
from spectra.report.leaderboard import HOLDS  # the full cache's mean score from which a task's baseline holds
#: ranks in words
ORDINALS = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth"}


def task_runs(runs: Runs) -> tuple[TaskRun, TaskRun]:
    """(the length sweep, the press run) among a block's `spectra cache` task runs: the sweep is the one over
    several lengths, the press run the one over several presses."""
    found = [run for run in runs.get("cache", []) if isinstance(run, TaskRun)]
    sweeps = [run for run in found if run.examples["length"].nunique() > 1]
    presses = [run for run in found if run not in sweeps]
    if len(sweeps) != 1 or len(presses) != 1:
        raise RenderError("the block must run one task file over several lengths (the full cache's baseline) and one "
                          f"at a single length (the presses), got {len(sweeps)} and {len(presses)}")
    return sweeps[0], presses[0]


def nll_run(runs: Runs):
    """The block's NLL run of `spectra cache` (licence text), the one that is not a task run."""
    found = [run for run in runs.get("cache", []) if not isinstance(run, TaskRun)]
    if len(found) != 1:
        raise RenderError(f"the block must run `spectra cache` once on text (the NLL run), got {len(found)}")
    return found[0]


def order(values: pd.Series, ascending: bool) -> str:
    """Presses from best to worst as `a` > `b` …, ties joined by '='."""
    ranked = values.sort_values(ascending=ascending, kind="stable")
    text, previous = "", None
    for press, value in ranked.items():
        text += ("" if previous is None else (" = " if value == previous else " > ")) + f"`{press}`"
        previous = value
    return text


def count_of(value: float, examples: int) -> str:
    """A mean score over `examples` examples as the count answered ('17 of 20')."""
    return f"{round(value * examples)} of {examples}"


def baseline_values(sweep: TaskRun) -> tuple[dict[str, str], dict[str, bool]]:
    """The full cache per length over the sweep's tasks, and passkey's per length: values and the claim that the
    baseline holds at the shortest length and fails at the longest."""
    full = sweep.examples[sweep.examples["press"] == "full"]
    lengths = sorted(full["length"].unique())
    per_length = full.groupby("length")["score"].mean()
    counts = full.groupby("length")["score"].size()
    passkey = full[full["task"] == "passkey"].groupby("length")["score"]
    values = {"lengths": slashed(lengths, lambda length: str(int(length))),
              "sweep_tasks": str(full["task"].nunique()),
              "sweep_examples": str(int(full.groupby(["task", "length"]).size().min())),
              "baseline": slashed([per_length[length] for length in lengths], two),
              "baseline_counts": slashed([count_of(per_length[length], counts[length]) for length in lengths]),
              "passkey": slashed([count_of(passkey.mean()[length], passkey.size()[length]) for length in lengths])}
    by_task = full.groupby(["task", "length"], sort=False)["score"].mean().unstack("length")
    never = [task for task in by_task.index if (by_task.loc[task] < HOLDS).all()]
    values["never"] = listed([f"`{task}` (at most {two(by_task.loc[task].max())})" for task in never]) or "none"
    claims = {"baseline-falls-with-length": bool(per_length.loc[lengths].is_monotonic_decreasing
                                                 and per_length[lengths[-1]] < per_length[lengths[0]]),
              "passkey-falls-with-length": bool(passkey.mean().loc[lengths].is_monotonic_decreasing
                                                and passkey.mean()[lengths[-1]] < passkey.mean()[lengths[0]]),
              "a-task-fails-at-every-length": bool(never)}
    return values, claims


def tasks_vs_nll(runs: Runs) -> Rendered:
    """docs/cache.md's task story against NLL: the baseline per length, then per press and ratio the mean score on
    the tasks whose baseline holds beside the full cache and beside the NLL run, and the two metrics' rankings of the
    presses (at half the cache, and Spearman's ρ over every press and ratio both ran)."""
    sweep, run = task_runs(runs)
    nll = nll_run(runs)
    values, claims = baseline_values(sweep)
    tasks = held(run)
    if not tasks:
        raise RenderError(f"{run.path}: the full cache answers no task of the run (≥ {HOLDS:g}): nothing to compare "
                          "presses on")
    scores = press_scores(run, tasks)
    frame = nll.table.set_index(["press", "ratio"])["nll"]
    presses = [press for press in compressing(run) if (press, HALF) in frame.index]
    ratios = [ratio for ratio in ratios_of(run) if all((press, ratio) in frame.index for press in presses)]
    if len(presses) < 2 or HALF not in ratios:
        raise RenderError(f"{run.path} and {nll.path} share fewer than two presses at ratio {HALF:g}")
    full_nll = float(frame[("full", 0.0)])
    rows = [["full (r = 0)", two(scores[("full", 0.0)]), "", "", f"{full_nll:.3f}", "", ""]]
    for press in presses:
        rows.append([f"`{press}`", *(two(scores[(press, ratio)]) for ratio in ratios),
                     *(f"{frame[(press, ratio)]:.3f}" for ratio in ratios)])
    header = ["press", *(f"score, r = {ratio:g}" for ratio in ratios), *(f"NLL, r = {ratio:g}" for ratio in ratios)]
    cells = pd.DataFrame({"score": [scores[(press, ratio)] for press in presses for ratio in ratios],
                          "nll": [frame[(press, ratio)] for press in presses for ratio in ratios]})
    rho = cells["score"].corr(-cells["nll"], method="spearman")
    half_scores = pd.Series({press: scores[(press, HALF)] for press in presses})
    half_nll = pd.Series({press: frame[(press, HALF)] for press in presses})
    dropped = [task for task in full_scores(run).index if task not in tasks]
    examples = run.examples[run.examples["press"] == "full"].groupby("task").size()
    values |= {"examples": str(int(examples.min())), "length": str(int(run.examples["length"].max())),
               "held": listed([f"`{task}`" for task in tasks]), "held_count": str(len(tasks)),
               "dropped": listed([f"`{task}` ({two(full_scores(run)[task])})" for task in dropped]) or "none",
               "full_score": two(scores[("full", 0.0)]), "table": table(header, rows), "holds": f"{HOLDS:g}",
               "nll_context": str(nll.meta["context"]), "nll_order": order(half_nll, ascending=True),
               "task_order": order(half_scores, ascending=False), "half": f"{HALF:g}",
               "rho": f"{rho:.2f}", "cells": str(len(cells)),
               "nll_best_loss": f"+{half_nll.min() - full_nll:.3f}",
               "task_best": two(half_scores.max()), "task_worst": two(half_scores.min())}
    worst = half_scores.idxmin()
    nll_rank = list(half_nll.sort_values(kind="stable").index).index(worst) + 1
    values |= {"task_worst_press": f"`{worst}`", "task_worst_nll_rank": ORDINALS.get(nll_rank, str(nll_rank)),
               "presses": str(len(presses)), "nll_worst_press": f"`{half_nll.idxmax()}`",
               "nll_worst_score": two(half_scores[half_nll.idxmax()])}
    claims |= {"same-best": bool(half_nll.idxmin() == half_scores.idxmax()
                                 and (half_scores == half_scores.max()).sum() == 1),
               "task-worst-not-nll-worst": bool(worst != half_nll.idxmax()),
               "rankings-disagree": bool(rho < 0.5),
               "tasks-spread-wider": bool(half_scores.max() - half_scores.min() > 0.2)}
    return Rendered(values, claims)


def smollm2_tasks(runs: Runs) -> Rendered:
    """docs/cache.md's task detail: per task, the full cache and each press's score per ratio with the paired
    difference's interval, the tasks left out, and whether keeping the needle predicts the answer."""
    sweep, run = task_runs(runs)
    scores = run.scores
    presses, ratios = compressing(run), ratios_of(run)
    full = full_scores(run)
    rows = []
    for task in full.index:
        mine = scores[scores["task"] == task].set_index(["press", "ratio"])
        rows.append([f"`{task}`", "full", two(full[task]), "", ""])
        for press in presses:
            rows.append(["", f"`{press}`", *(cell(mine.loc[(press, ratio)]) for ratio in ratios)])
    header = ["task", "press", *(f"r = {ratio:g}" for ratio in ratios)]
    predicts = needle_vs_score(run).set_index("press")
    every = predicts.loc["all"]
    evicted = run.evicted
    lost = int((evicted["evicted"] > 0).sum())
    per_length = full_scores(sweep, ("task", "length")).unstack("length")
    lengths = list(per_length.columns)
    sweep_rows = [[f"`{task}`", *(two(per_length.loc[task, length]) for length in lengths)] for task in per_length.index]
    streaming = sweep.examples[sweep.examples["press"] != "full"]
    pressed = streaming.groupby(["task", "length"])["score"].mean().unstack("length")
    sweep_press = compressing(sweep)
    if len(sweep_press) == 1 and len(ratios_of(sweep)) == 1:
        for row, task in zip(sweep_rows, per_length.index):
            row.extend(two(pressed.loc[task, length]) for length in lengths)
        sweep_header = ["task", *(f"full, {int(length)}" for length in lengths),
                        *(f"{sweep_press[0]} r = {ratios_of(sweep)[0]:g}, {int(length)}" for length in lengths)]
    else:
        sweep_header = ["task", *(f"full, {int(length)}" for length in lengths)]
    values = {"examples": str(int(run.examples[run.examples["press"] == "full"].groupby("task").size().min())),
              "length": str(int(run.examples["length"].max())), "table": table(header, rows),
              "held": listed([f"`{task}`" for task in held(run)]), "holds": f"{HOLDS:g}",
              "answered": str(int(every["answered"])), "missed": str(int(every["missed"])),
              "kept_answered": two(every["kept_answered"]), "kept_missed": two(every["kept_missed"]),
              "auc": two(every["auc"]),
              "aucs": listed([f"`{press}` {two(predicts.loc[press, 'auc'])}" for press in presses
                              if press in predicts.index and predicts.loc[press, "auc"] == predicts.loc[press, "auc"]]),
              "failed": str(len(evicted)), "lost": str(lost),
              "sweep_examples": str(int(sweep.examples[sweep.examples["press"] == "full"]
                                        .groupby(["task", "length"]).size().min())),
              "sweep_table": table(sweep_header, sweep_rows)}
    return Rendered(values, {"survival-predicts-score": bool(every["auc"] > 0.7),
                             "missed-kept-less": bool(every["kept_missed"] < every["kept_answered"])})


def cell(row: pd.Series) -> str:
    """A press's mean score on a task with the paired difference from the full cache and its 95% interval."""
    return f"{two(row['score'])} ({row['delta']:+.2f} [{row['delta_low']:+.2f}, {row['delta_high']:+.2f}])"
