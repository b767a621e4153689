"""One board on two models: the same presses on the same needles with two models (SmolLM2 and Gemma 3) — what of a
ranking made on one model holds on another.

Two task files written by `spectra tasks` with the same --tasks order, --length, --samples, --seed and haystacks,
one per model's tokenizer, hide the same needles at the same depths (the needles are drawn apart from the tokens).
`paired` pools each model's runs (`leaderboard.pooled`) and lines them up: refused in one line where the two arms
are one model, differ in seed or protocol, read another haystack for a task, or hide other needles; kept are the
examples both hold (`arms.matched`), of the tasks both full caches hold (mean score ≥ `leaderboard.HOLDS`: a press
cannot lose what its model never had, so a task one model fails says nothing about the presses — each model's
full-cache score per task is in `Pair.baseline`), and the presses and ratios both ran. `report.arms` then compares
them: per press and ratio the two scores with the paired difference, each model's verdict against its own full
cache and where it flips, and Kendall's τ between the two rankings with its interval over the needles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from ..errors import SpectraError
from . import arms, leaderboard
from .haystacks import haystack_of

if TYPE_CHECKING:
    from .evaluate import TaskRun


@dataclass(frozen=True)
class Pair:
    """Two models' rows on their shared needles (`rows`, with an `arm` column: the model's name), the two names in
    order (`arms`), and per task each model's full-cache score, its examples and whether the task is compared
    (`baseline`: task, model, examples, full, held)."""

    rows: pd.DataFrame
    arms: tuple[str, str]
    baseline: pd.DataFrame


def model_name(runs: Sequence[TaskRun]) -> str:
    """The model the runs (pooled: one model) ran, as run.json names it."""
    return str(runs[0].meta.get("model", {}).get("name"))


def paired(first: Sequence[TaskRun], second: Sequence[TaskRun], holds: float = leaderboard.HOLDS) -> Pair:
    """The two models' runs lined up on the needles and tasks they share (see the module docstring)."""
    names = (model_name(first), model_name(second))
    if names[0] == names[1]:
        raise SpectraError(f"both arms ran {names[0]}: give one model's runs to `spectra leaderboard` as one board, or "
                           "another model's task runs as the second arm")
    pooled = {names[0]: leaderboard.pooled(list(first)), names[1]: leaderboard.pooled(list(second))}
    # each model has its own task file (its tokenizer's); the seed and the protocol they share
    for name, mine, theirs in list(zip(leaderboard.FACTS, leaderboard.facts(first[0]),
                                       leaderboard.facts(second[0])))[2:]:
        if mine != theirs:
            raise SpectraError(f"{first[0].path} and {second[0].path} differ in their {name} ({mine} vs {theirs}): "
                               "compare models on one seed and protocol")
    needles = arms.matched(pooled, every=False)
    tasks = list(dict.fromkeys(needles["task"]))
    read = [haystack_of(list(runs), tasks) for runs in (first, second)]
    for task in tasks:
        if read[0][task] != read[1][task]:
            raise SpectraError(f"{task} read {read[0][task]} with {names[0]} and {read[1][task]} with {names[1]}: "
                               "give both models task files of the same haystacks")
    records = []
    for name, rows in pooled.items():
        full = rows[(rows["press"] == "full") & rows["example"].isin(needles.index)]
        for task, scores in full.drop_duplicates("example").groupby("task", sort=False)["score"]:
            records.append({"task": task, "model": name, "examples": len(scores), "full": scores.mean()})
    baseline = pd.DataFrame(records)
    held_by = baseline.groupby("task", sort=False)["full"].min() >= holds
    baseline["held"] = baseline["task"].map(held_by)
    if not held_by.any():
        raise SpectraError(f"no task's full cache answers at least {holds:g} of its examples with both models: "
                           "nothing to compare presses on (a shorter --length may hold)")
    kept = needles.index[needles["task"].map(held_by).to_numpy(dtype=bool)]
    return Pair(arms.joined(pooled, kept), names, baseline)


def draw(order: pd.DataFrame, names: tuple[str, str], tau: dict[str, float], flipped: Sequence[str] = ()):
    """Each press's mean score over the ratios on one model against the other (`arms.ranked`'s order), the diagonal
    where they agree, the presses whose verdict flips at some ratio in red, Kendall's τ in the title."""
    from .plots import style

    plt = style.pyplot()
    figure, ax = plt.subplots(figsize=(6.4, 6.0))
    x, y = order[f"{names[0]}_score"].to_numpy(), order[f"{names[1]}_score"].to_numpy()
    flips = order["press"].isin(list(flipped)).to_numpy()
    ax.plot([0, 1], [0, 1], **style.EXACT_STYLE)
    if (~flips).any():
        ax.scatter(x[~flips], y[~flips], s=22, color="0.25", zorder=3, label="the same verdict at every ratio")
    if flips.any():
        ax.scatter(x[flips], y[flips], s=30, color="tab:red", zorder=4, label="a verdict that flips at some ratio")
    labels = [style.press_label(press, 28) for press in order["press"]]
    # a character of 6.5 pt on this panel is about 0.011 score units wide and a line 0.024 tall
    widths = [0.011 * max(len(line) for line in label.split("\n")) for label in labels]
    tall = 0.024 * max(label.count("\n") + 1 for label in labels)
    for label, px, py, ly in zip(labels, x, y, style.label_heights(x + 0.008, y + 0.004, widths, tall)):
        joined = {"arrowprops": {"arrowstyle": "-", "color": "0.6", "lw": 0.5}} if ly > py + 0.01 else {}
        ax.annotate(label, (px, py), xytext=(px + 0.008, ly), textcoords="data", fontsize=6.5, va="bottom",
                    **joined)
    ax.set(xlim=(-0.03, 1.03), ylim=(-0.03, 1.03), xlabel=f"{names[0]}: mean score over the ratios",
           ylabel=f"{names[1]}: mean score over the ratios")
    ax.set_title(style.title_lines(f"The same presses on the same needles, two models: Kendall's {arms.tau_text(tau)}",
                                   70), fontsize=9)
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3)
    return figure
