"""Noise against prose: the same presses on the same needles, hidden once in RULER's noise sentence repeated and once
in prose — what a leaderboard's haystack does to its scores and its ranking.

RULER hides the needles of its essay tasks (niah_single_2/3, niah_multikey_1, …) in essays. A task file whose
essay tasks read `--haystack noise` puts the same needles (the same keys, values and depths: `spectra tasks` draws
them apart from the haystack) between copies of one sentence instead. On a repeated sentence the context's last
tokens attend to earlier copies of themselves, so a press that scores by the window's attention can keep copies and
drop the needle for the haystack's sake. `compared` measures it: the runs of each arm are pooled
(`leaderboard.pooled`), their examples matched by index, task and depth (and refused in one line where they are not
the same needles or the haystacks are not noise and prose), and per press and ratio the two scores stand side by
side with the paired difference prose − noise: the same task-stratified Poisson-bootstrap weights for both arms
(`ranks.replicates`: an example's weights depend on its index only), so the difference's interval is paired over
the needles. `ranked` orders the presses by their mean over the ratios on each haystack and gives Kendall's τ
between the two orders with its bootstrap interval: whether the ranking is the haystack's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..errors import SpectraError
from ..kv.tasks.haystack import NOISE_NAME
from ..kv.tasks.summary import LEVEL
from . import leaderboard, ranks

if TYPE_CHECKING:
    from .evaluate import TaskRun

#: the two arms, in the order the tables give them
ARMS = ("noise", "prose")


def haystack_of(runs: Sequence[TaskRun], tasks: Sequence[str]) -> dict[str, str]:
    """Per task among `tasks`, the haystack the runs' records read (run.json `haystacks`; one line where a run does
    not say, or two runs of one arm say otherwise)."""
    found: dict[str, str] = {}
    for run in runs:
        said = {task: entry["name"] for entry in run.meta.get("haystacks") or [] for task in entry.get("tasks", [])}
        for task in tasks:
            if task not in said:
                raise SpectraError(f"{run.path} does not say which haystack {task} read (a run before run.json "
                                   "recorded `haystacks`): rerun it with this spectra")
            if found.setdefault(task, said[task]) != said[task]:
                raise SpectraError(f"{run.path}'s {task} read {said[task]} where another run of its arm read "
                                   f"{found[task]}: pool runs of one task file per arm")
    return found


def paired(noise: Sequence[TaskRun], prose: Sequence[TaskRun]) -> pd.DataFrame:
    """The per-example rows of both arms on the needles they share, with a `haystack` column ("noise", "prose"):
    the noise arm's examples (every one must be in the prose arm, the same task at the same depth), the prose arm's
    rows of those examples, and the presses and ratios both arms ran. Refused in one line where the arms' model,
    seed or protocol differ, an example is not the same needle, a task of the noise arm did not read noise or the
    prose arm's read noise too, or no press is in both."""
    arms = {"noise": leaderboard.pooled(list(noise)), "prose": leaderboard.pooled(list(prose))}
    first = {"noise": noise[0], "prose": prose[0]}
    # the task files differ by their haystack; everything else a board's runs share, the arms share
    for name, mine, theirs in list(zip(leaderboard.FACTS, *(leaderboard.facts(first[arm]) for arm in ARMS)))[1:]:
        if mine != theirs:
            raise SpectraError(f"{first['noise'].path} and {first['prose'].path} differ in their {name} ({mine} vs "
                               f"{theirs}): compare haystacks on one model, seed and protocol")
    needles = arms["noise"][arms["noise"]["press"] == "full"].set_index("example")[["task", "depth"]]
    theirs = arms["prose"][arms["prose"]["press"] == "full"].set_index("example")[["task", "depth"]]
    missing = needles.index.difference(theirs.index)
    if len(missing):
        raise SpectraError(f"the prose runs lack examples {leaderboard.spans(list(missing))} of the noise runs: run both "
                           "arms on task files of the same needles (`spectra tasks` with the same --tasks order, "
                           "--length, --samples and --seed)")
    other = theirs.reindex(needles.index)
    differ = needles.index[(other["task"] != needles["task"]) | ~np.isclose(other["depth"], needles["depth"],
                                                                             equal_nan=True)]
    if len(differ):
        where = differ[0]
        raise SpectraError(f"example {where} is {needles.loc[where, 'task']} at depth {needles.loc[where, 'depth']:.3f} "
                           f"in the noise runs but {other.loc[where, 'task']} at depth {other.loc[where, 'depth']:.3f} "
                           "in the prose runs: the arms must hide the same needles")
    tasks = list(dict.fromkeys(needles["task"]))
    read = {arm: haystack_of(list(runs), tasks) for arm, runs in (("noise", noise), ("prose", prose))}
    for task in tasks:
        if read["noise"][task] != NOISE_NAME or read["prose"][task] == NOISE_NAME:
            raise SpectraError(f"{task} read {read['noise'][task]} in the noise runs and {read['prose'][task]} in the "
                               "prose runs: the noise arm's tasks read --haystack noise and the prose arm's a text")
    cells = [set(map(tuple, rows.loc[rows["press"] != "full", ["press", "ratio"]].to_numpy()))
             for rows in arms.values()]
    shared = cells[0] & cells[1]
    if not shared:
        raise SpectraError("no press ran at the same ratio in both arms: give runs of the same presses")
    parts = []
    for arm, rows in arms.items():
        rows = rows[rows["example"].isin(needles.index)]
        keep = (rows["press"] == "full") | pd.Series(list(zip(rows["press"], rows["ratio"])),
                                                     index=rows.index).isin(shared)
        parts.append(rows[keep].assign(haystack=arm))
    return pd.concat(parts, ignore_index=True)


def compared(rows: pd.DataFrame, seed: int, level: float = LEVEL) -> pd.DataFrame:
    """Per press and ratio (the full cache first, at ratio 0) over the paired examples (`paired`): examples, the
    noise arm's score and 95% interval, the prose arm's, and the difference prose − noise with its paired interval;
    also the difference's share of examples where the arms disagree (`changed`)."""
    table = ranks.scores(rows, ["haystack", "press", "ratio"])
    boot = ranks.replicates(table, seed)
    low, high = ranks.percentile(boot, level)
    records = []
    for press, ratio in dict.fromkeys((press, ratio) for _, press, ratio in table.cells):
        one, two = table.column(("noise", press, ratio)), table.column(("prose", press, ratio))
        diff_low, diff_high = ranks.percentile(boot[:, [two]] - boot[:, [one]], level)
        noise, prose = table.values[:, one], table.values[:, two]
        records.append({"press": press, "ratio": ratio, "examples": len(noise), "noise": noise.mean(),
                        "noise_low": low[one], "noise_high": high[one], "prose": prose.mean(), "prose_low": low[two],
                        "prose_high": high[two], "delta": (prose - noise).mean(), "delta_low": diff_low[0],
                        "delta_high": diff_high[0], "changed": float((prose != noise).mean())})
    return pd.DataFrame(records)


def ranked(rows: pd.DataFrame, seed: int, level: float = LEVEL) -> tuple[pd.DataFrame, dict[str, float]]:
    """(per press its mean over the ratios and its rank on each haystack, the presses in the prose arm's order;
    Kendall's τ between the two arms' orders with its 95% interval over the same bootstrap replicates)."""
    from scipy.stats import kendalltau, rankdata

    pressed = rows[rows["press"] != "full"]
    unit = ranks.units(pressed)
    means = pressed.groupby(["haystack", "press", *unit], sort=False).agg(score=("score", "mean"),
                                                                          task=("task", "first")).reset_index()
    table = ranks.scores(means, ["haystack", "press"])
    boot = ranks.replicates(table, seed)
    presses = list(dict.fromkeys(press for _, press in table.cells))
    columns = {arm: [table.column((arm, press)) for press in presses] for arm in ARMS}
    score = {arm: table.values[:, columns[arm]].mean(axis=0) for arm in ARMS}
    order = pd.DataFrame({"press": presses, **{f"{arm}_score": score[arm] for arm in ARMS},
                          **{f"{arm}_rank": rankdata(-np.round(score[arm], ranks.DECIMALS), method="min").astype(int)
                             for arm in ARMS}})
    tau = kendalltau(score["noise"], score["prose"]).statistic
    taus = np.array([kendalltau(row[columns["noise"]], row[columns["prose"]]).statistic for row in boot])
    taus = taus[np.isfinite(taus)]
    tail = (1 - level) / 2
    interval = (np.quantile(taus, tail), np.quantile(taus, 1 - tail)) if len(taus) else (np.nan, np.nan)
    return (order.sort_values(["prose_rank", "noise_rank"], kind="stable").reset_index(drop=True),
            {"tau": float(tau), "low": float(interval[0]), "high": float(interval[1]), "presses": len(presses)})
