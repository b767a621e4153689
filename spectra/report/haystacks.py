"""Noise against prose: the same presses on the same needles, hidden once in RULER's noise sentence repeated and once
in prose — what a leaderboard's haystack does to its scores and its ranking.

RULER hides the needles of its essay tasks (niah_single_2/3, niah_multikey_1, …) in essays. A task file whose
essay tasks read `--haystack noise` puts the same needles (the same keys, values and depths: `spectra tasks` draws
them apart from the haystack) between copies of one sentence instead. On a repeated sentence the context's last
tokens attend to earlier copies of themselves, so a press that scores by the window's attention can keep copies and
drop the needle for the haystack's sake. `paired` lines the arms up: the runs of each arm are pooled
(`leaderboard.pooled`), their examples matched by index, task and depth (and refused in one line where they are not
the same needles or the haystacks are not noise and prose); `report.arms` then sets the two scores of each press
and ratio side by side with the paired difference prose − noise, and gives Kendall's τ between the two rankings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..errors import SpectraError
from ..kv.tasks.haystack import NOISE_NAME
from . import arms, leaderboard

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
    """The per-example rows of both arms on the needles they share, with an `arm` column ("noise", "prose"):
    the noise arm's examples (every one must be in the prose arm, the same task at the same depth), the prose arm's
    rows of those examples, and the presses and ratios both arms ran. Refused in one line where the arms' model,
    seed or protocol differ, an example is not the same needle, a task of the noise arm did not read noise or the
    prose arm's read noise too, or no press is in both."""
    pooled = {"noise": leaderboard.pooled(list(noise)), "prose": leaderboard.pooled(list(prose))}
    first = {"noise": noise[0], "prose": prose[0]}
    # the task files differ by their haystack; everything else a board's runs share, the arms share
    for name, mine, theirs in list(zip(leaderboard.FACTS, *(leaderboard.facts(first[arm]) for arm in ARMS)))[1:]:
        if mine != theirs:
            raise SpectraError(f"{first['noise'].path} and {first['prose'].path} differ in their {name} ({mine} vs "
                               f"{theirs}): compare haystacks on one model, seed and protocol")
    needles = arms.matched(pooled)
    tasks = list(dict.fromkeys(needles["task"]))
    read = {arm: haystack_of(list(runs), tasks) for arm, runs in (("noise", noise), ("prose", prose))}
    for task in tasks:
        if read["noise"][task] != NOISE_NAME or read["prose"][task] == NOISE_NAME:
            raise SpectraError(f"{task} read {read['noise'][task]} in the noise runs and {read['prose'][task]} in the "
                               "prose runs: the noise arm's tasks read --haystack noise and the prose arm's a text")
    return arms.joined(pooled, needles.index)
