"""The leaderboard: task runs of one task file pooled into one ranking of presses, each score with its interval.

A leaderboard's press list is too long for one sitting (every press at four ratios on hundreds of examples), and
presses arrive later (a fitted artifact, a new press): so it is several runs of `spectra evaluate` on the same task
file, model and seed, each with its own presses, pooled here (`pooled`). The full cache's answers must agree run
for run on the examples the runs share (same model, same decoding); then every run must hold the same examples and
every press the same ratios, and a (press, ratio) cell may come from one run only. Each is checked, not assumed,
and refused in one line naming the run directories and what differs (the examples one has and the other lacks,
the ratios): ranking on only what the runs share would silently change every other press's numbers, and a press's
mean over r compares presses only over the same ratios.

The ranking is over the tasks the full cache holds (mean score ≥ `HOLDS`, as kvpress's leaderboard reads only
tasks its model answers: a press cannot lose what the full cache never had). `standings` gives per press and ratio
the mean score over every example of those tasks (each task contributes its examples, so equal counts weigh tasks
equally), with the full cache beside it and the paired difference, 95% intervals of a Poisson bootstrap that
resamples examples within each task with the same weights for every press (`ranks`: an example's weights fixed by
its index and the run's seed; Clopper–Pearson's bounds where every example of a cell scores 0, or every one 1).
`ranking` orders presses by their mean over the ratios run — per example the average of its ratios' scores,
bootstrapped the same way, so the ranking's intervals are as paired as the cells' — the area under a press's
score-vs-ratio curve at kvpress's leaderboard ratios; beside each rank its 95% interval over the replicates and its
tier (`ranks.tiers`: Holm-corrected paired tests). A press is ranked only where it compressed as far as each ratio
asks: its cells' mean stored share of the context cache's bytes at most 1 − r (`reached`, within
`REACH_TOLERANCE`). A press whose ratio means something else, or nothing (simlayerkv keeps every layer whole at
kvpress's defaults on a context of up to 1029 tokens; think's r is the share of key channels, half the bytes;
kivi's bits are in its name), is still listed, after the ranked ones and without a rank: ranking it beside presses
that saved what r says would compare caches of different sizes. `FILTERS` are the rows presses are judged on:
every example of the held tasks; only the examples the full cache answers (`answered_rows`: where no task holds
as a whole, as with many questions per context, a press's score there is the share of the full cache's answers it
keeps); every example. `draw` is the picture: presses down in rank order, ratios across, the score in each cell;
`pooled_needle` the runs' needle tables as one, for where a press keeps the needle per layer and head
(`report.evaluate.draw_survival`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..errors import SpectraError
from . import ranks
from .plots import style
from .plots.style import pyplot

if TYPE_CHECKING:
    from .evaluate import TaskRun

#: the full cache's mean score a task needs to count in the ranking
HOLDS = 0.8
#: how far above 1 − r a cell's mean stored share of the cache's bytes may lie and still count as compressed to r
#: (a kept count is a whole number of tokens; quantized rows store their scales too)
REACH_TOLERANCE = 0.01
#: the characters of the picture's title (at its font size) one inch of the figure's width holds
TITLE_CHARACTERS_PER_INCH = 13


def spans(values: Sequence[int], most: int = 6) -> str:
    """Whole numbers as runs, '0–3, 8, 10–12', the first `most` runs and a count of the rest."""
    ordered = sorted(set(int(value) for value in values))
    runs: list[list[int]] = []
    for value in ordered:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    written = [f"{low}" if low == high else f"{low}–{high}" for low, high in runs[:most]]
    rest = f", … ({len(ordered)} in all)" if len(runs) > most else ""
    return ", ".join(written) + rest


def ratios_text(ratios: Sequence[float]) -> str:
    """'0.25, 0.5, 0.75'."""
    return ", ".join(f"{ratio:g}" for ratio in sorted(ratios))


#: what the runs of one board share, in `facts`' order
FACTS = ("task file", "model", "seed", "protocol (--query-aware)")


def facts(run: TaskRun) -> tuple:
    """A task run's `FACTS`: its task file's sha256, model name, seed and whether the question was compressed."""
    data, settings = run.meta.get("data", {}), run.meta.get("settings", {})
    return (data.get("sha256"), run.meta.get("model", {}).get("name"), settings.get("seed"),
            bool(run.meta.get("query_aware", settings.get("extra", {}).get("query_aware", False))))


def pooled(runs: Sequence[TaskRun]) -> pd.DataFrame:
    """The per-example rows of `runs` as one table: the full cache's rows once, every run's press rows. The runs
    must share the task file, model, seed and protocol; their full caches answer alike on the examples they share
    (checked first, so that a decoding difference is named as one) and they run the same examples; every press
    runs every example at the same ratios (a press's mean over r compares presses only over the same ratios and
    examples), and the runs have disjoint (press, ratio) cells. Refused in one line otherwise, naming the run
    directories and what differs: pooling on what they share would silently change every other press's numbers."""
    if not runs:
        raise SpectraError("a leaderboard pools one or more task runs: give their run directories")
    first = runs[0]
    unit = ["example", "question"] if "question" in first.examples.columns else ["example"]

    def answers(run: TaskRun) -> pd.Series:
        return run.examples[run.examples["press"] == "full"].set_index(unit)["prediction"].astype(str).sort_index()

    full = answers(first)
    seen: dict[tuple[str, float], str] = {}
    parts = [first.examples[first.examples["press"] == "full"]]
    for run in runs:
        for name, mine, theirs in zip(FACTS, facts(run), facts(first)):
            if mine != theirs:
                raise SpectraError(f"{run.path} and {first.path} differ in their {name} ({mine} vs {theirs}): a "
                                   "leaderboard pools runs of one task file, model, seed and protocol")
        own = answers(run)
        shared = own.index.intersection(full.index)
        differ = shared[(own.reindex(shared) != full.reindex(shared)).to_numpy()]
        if len(differ):
            where = differ[0]
            named = (f"example {int(where[0])}, question {int(where[1])}" if isinstance(where, tuple)
                     else f"example {int(where)}")
            raise SpectraError(
                f"the full cache of {run.path} answered otherwise than {first.path}'s on {len(differ)} of the "
                f"{len(shared)} examples they share ({named}: {own[where]!r} vs {full[where]!r}): the runs did not "
                "decode alike (another spectra version or --dtype?)")
        if not own.index.equals(full.index):
            extra = own.index.difference(full.index).get_level_values("example")
            lacks = full.index.difference(own.index).get_level_values("example")
            said = [f"has examples {spans(extra)} that {first.path} lacks" if len(extra) else "",
                    f"lacks examples {spans(lacks)} that {first.path} has" if len(lacks) else ""]
            raise SpectraError(f"{run.path} {' and '.join(part for part in said if part)}: a leaderboard ranks every "
                               "press on the same examples: run both on the same task file and --samples (an "
                               "interrupted run finishes with --resume)")
        cells = run.examples[run.examples["press"] != "full"]
        for (press, ratio), cell in cells.groupby(["press", "ratio"], sort=False):
            mine = cell.set_index(unit).index
            if not full.index.isin(mine).all():
                raise SpectraError(f"{press} at ratio {ratio:g} in {run.path} lacks examples "
                                   f"{spans(full.index.difference(mine).get_level_values('example'))} that its full "
                                   "cache answered: a leaderboard ranks every press on the same examples")
            if (press, ratio) in seen:
                raise SpectraError(f"{press} at ratio {ratio:g} is in {seen[(press, ratio)]} and {run.path}: give "
                                   "each cell of the leaderboard one run")
            seen[(press, ratio)] = str(run.path)
        parts.append(cells)
    examples = pd.concat(parts, ignore_index=True)
    board: tuple[str, str, frozenset] | None = None  # the first press's run, name and ratios
    pressed = examples[examples["press"] != "full"]
    for press, ratios in pressed.groupby("press", sort=False)["ratio"].agg(frozenset).items():
        where = seen[(press, min(ratios))]
        if board is None:
            board = (where, press, ratios)
        elif ratios != board[2]:
            raise SpectraError(f"{where} ran {press} at ratios {ratios_text(ratios)} and {board[0]} ran {board[1]} at "
                               f"ratios {ratios_text(board[2])}: a press's mean over r compares presses only over the "
                               "same ratios: run every press at the same --ratios")
    return examples


def pooled_needle(runs: Sequence[TaskRun]) -> pd.DataFrame:
    """The runs' needle tables (task_needle.csv: per press, ratio, layer and key/value head) as one, the full cache's
    rows once (the runs were checked alike by `pooled`)."""
    first = runs[0].needle
    return pd.concat([first[first["press"] == "full"],
                      *(run.needle[run.needle["press"] != "full"] for run in runs)], ignore_index=True)


def held(examples: pd.DataFrame, holds: float = HOLDS) -> tuple[list[str], dict[str, float]]:
    """(the tasks whose full cache scores ≥ `holds`, {every other task: its full cache's mean score})."""
    full = examples[examples["press"] == "full"].groupby("task", sort=False)["score"].mean()
    return ([task for task, score in full.items() if score >= holds],
            {task: float(score) for task, score in full.items() if score < holds})


def held_rows(examples: pd.DataFrame, holds: float = HOLDS) -> pd.DataFrame:
    """The rows of the held tasks (`held`), which presses are ranked on; none held is one line."""
    tasks, _ = held(examples, holds)
    if not tasks:
        raise SpectraError(f"the full cache answers no task (mean score ≥ {holds:g}): nothing to rank presses on")
    return examples[examples["task"].isin(tasks)]


def answered_rows(examples: pd.DataFrame) -> pd.DataFrame:
    """The rows of the questions the full cache answers (score 1), each (example, question) with every press's row
    of it: where no task holds as a whole (SmolLM2 answers about half the questions of a many-question record at
    any length it fits), a press is judged on what the full cache had, and its score there is the share of those
    answers it keeps. None answered is one line."""
    unit = ["example", "question"] if "question" in examples.columns else ["example"]
    full = examples[examples["press"] == "full"]
    answered = full.loc[full["score"] >= 1, unit]
    if answered.empty:
        raise SpectraError("the full cache answers no question: nothing to judge presses on")
    keys = examples.set_index(unit).index
    return examples[keys.isin(answered.set_index(unit).index)]


#: the filters a board's presses are judged under, as the pages name them
FILTERS = {"held": "every example of the held tasks", "answered": "only the examples the full cache answers",
           "all": "every example"}


def chosen(examples: pd.DataFrame, holds: float, over: str) -> pd.DataFrame:
    """The rows presses are judged on (`FILTERS`): `over` "held", the tasks the full cache holds (`held_rows`);
    "answered", the questions it answers (`answered_rows`); "all", every row."""
    if over == "held":
        return held_rows(examples, holds)
    if over == "answered":
        return answered_rows(examples)
    if over == "all":
        return examples
    raise ValueError(f"over is one of {', '.join(map(repr, FILTERS))}, got {over!r}")


def seed_of(runs: Sequence[TaskRun]) -> int:
    """The pooled runs' seed (`pooled` checked they share it), which fixes the bootstrap's weights."""
    return int(runs[0].meta.get("settings", {}).get("seed", 0))


def standings(examples: pd.DataFrame, seed: int, holds: float = HOLDS, over: str = "held") -> pd.DataFrame:
    """Per (press, ratio) over the held tasks' examples (or the rows `over` chooses: `chosen`): examples, score,
    low, high, full, delta, delta_low, delta_high, bytes_share, with task-stratified paired bootstrap intervals
    (`ranks.summary`); the full cache first."""
    rows = chosen(examples, holds, over)
    table = ranks.scores(rows, ("press", "ratio"))
    summary = ranks.summary(table, ranks.replicates(table, seed), ("full", 0.0))
    keys = pd.DataFrame(summary.pop("cell").tolist(), columns=["press", "ratio"])
    return pd.concat([keys, summary], axis=1)


def stored_shares(examples: pd.DataFrame) -> pd.Series:
    """Per (press, ratio), the full cache left out: its cells' mean stored share of the context cache's bytes."""
    pressed = examples[examples["press"] != "full"]
    return pressed.groupby(["press", "ratio"])["bytes_share"].mean()


def reached(examples: pd.DataFrame) -> pd.Series:
    """Per press (the full cache left out): whether at every ratio it ran its cells' mean stored share of the
    context cache's bytes (`stored_shares`) is at most 1 − r (+ `REACH_TOLERANCE`): whether it compressed as far as
    the ratios ask."""
    stored = stored_shares(examples).reset_index()
    stored["reached"] = stored["bytes_share"] <= 1.0 - stored["ratio"] + REACH_TOLERANCE
    return stored.groupby("press")["reached"].all()


def ranking(examples: pd.DataFrame, seed: int, holds: float = HOLDS, over: str = "held") -> pd.DataFrame:
    """Per press (the full cache first), over the held tasks' examples (or the rows `over` chooses: `chosen`), the
    mean over its ratios: `ratios` (how many it ran), score, low, high, full, delta, delta_low, delta_high,
    `reached` (`reached`); `rank` 1 for the best press that reached its ratios (ties share a rank), sorted by it,
    with `rank_low`–`rank_high` its rank's 95% interval over the bootstrap's replicates and `tier` (`ranks.tiers`:
    Holm-corrected paired tests among the ranked presses); the presses that did not follow, by score, with none of
    these (<NA>)."""
    rows = chosen(examples, holds, over)
    done = reached(examples)
    unit = ranks.units(rows)
    counts = rows.groupby("press")["ratio"].nunique()
    averaged = rows.groupby(["press", *unit], as_index=False, sort=False).agg(
        score=("score", "mean"), bytes_share=("bytes_share", "mean"), task=("task", "first"))
    scores = ranks.scores(averaged, ("press",))
    boot = ranks.replicates(scores, seed)
    table = ranks.summary(scores, boot, "full").rename(columns={"cell": "press"})
    table.insert(1, "ratios", table["press"].map(counts).astype(int))
    pressed = table[table["press"] != "full"].copy()
    pressed["reached"] = pressed["press"].map(done).fillna(False).astype(bool)
    pressed["rank"] = pressed["score"].where(pressed["reached"]).rank(ascending=False, method="min").astype("Int64")
    pressed = pressed.assign(after=~pressed["reached"], behind=-pressed["score"]).sort_values(
        ["after", "rank", "behind", "press"], kind="stable").drop(columns=["after", "behind"])
    ranked = pressed.loc[pressed["reached"], "press"].tolist()
    columns = [scores.column(press) for press in ranked]
    low, high = ranks.rank_intervals(boot[:, columns])
    tier = ranks.tiers(ranks.separated(scores, boot, columns))
    extra = pd.DataFrame({"press": ranked, "rank_low": low, "rank_high": high, "tier": tier})
    pressed = pressed.merge(extra, on="press", how="left")
    full = table[table["press"] == "full"].assign(reached=True, rank=0, rank_low=0, rank_high=0, tier=0)
    return pd.concat([full, pressed], ignore_index=True).astype(
        {"rank": "Int64", "rank_low": "Int64", "rank_high": "Int64", "tier": "Int64"})


def draw(table: pd.DataFrame, order: pd.DataFrame, title: str, label: str = "Mean score"):
    """Presses down in `order`'s rank order (the full cache on top; below a line, the presses that did not compress
    as far as r asks, unranked), the ratios and their mean across: each cell's score written in it, coloured on one
    scale from 0 to 1 whose bar says what a cell is (`label`)."""
    plt = pyplot()
    ratios = sorted(set(table["ratio"]) - {0.0})
    presses = list(order["press"])
    cells = table.set_index(["press", "ratio"])["score"]
    mean = order.set_index("press")["score"]
    values = np.full((len(presses), len(ratios) + 1), np.nan)
    for row, press in enumerate(presses):
        for column, ratio in enumerate(ratios):
            values[row, column] = cells.get((press, 0.0 if press == "full" else ratio), np.nan)
        values[row, -1] = mean[press]
    figure, ax = plt.subplots(figsize=(1.0 * (len(ratios) + 1) + 3.2, 0.27 * len(presses) + 1.6),
                              layout="constrained")
    image = ax.pcolormesh(np.arange(len(ratios) + 2) - 0.5, np.arange(len(presses) + 1) - 0.5, values,
                          cmap=style.HEATMAP_CMAP, vmin=0.0, vmax=1.0, shading="flat", gid="leaderboard")
    for (row, column), value in np.ndenumerate(values):
        if np.isfinite(value):
            ax.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=7.5,
                    color="white" if value < 0.55 else "black")
    ax.axvline(len(ratios) - 0.5, color="white", linewidth=2.5)
    ax.set_ylim(len(presses) - 0.5, -0.5)
    ax.set_xticks(range(len(ratios) + 1), [f"{ratio:g}" for ratio in ratios] + ["mean"])
    ax.set_yticks(range(len(presses)), [press if press == "full" else f"{rank}. {press}" if not pd.isna(rank)
                                        else f"({press}: not at r)" for press, rank in zip(presses, order["rank"])],
                  fontsize=8)
    unranked = int(order["rank"].isna().sum())
    if unranked:  # the presses that did not compress as far as r asks, below a line
        ax.axhline(len(presses) - unranked - 0.5, color="white", linewidth=2.5)
    ax.set_xlabel("Ratio removed (r)")
    ax.tick_params(length=0)
    figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02).set_label(label)
    width = figure.get_size_inches()[0]
    figure.suptitle(style.title_lines(title, int(width * TITLE_CHARACTERS_PER_INCH)), fontsize=9.5)
    return figure
