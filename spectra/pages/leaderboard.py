"""`spectra leaderboard RUN… --out DIR`: task runs of one task file pooled into one ranking of presses.

The runs pooled (`report.leaderboard.pooled`: one task file, model, seed and protocol, the same examples and ratios);
per press and ratio the mean score over every example of the tasks whose full cache holds, with its 95% interval,
and the ranking by the mean over the ratios, each rank with its 95% interval and its tier (`report.ranks`). The page
writes the whole ranking (with the column `= kvpress (cells)`: per press the answers equal to kvpress 0.5.5's of those
compared, read from the committed comparisons, `--equality`, `report.equality`), the same ranking over only the
examples the full cache answers, the per-task tables, the interval widths, where SnapKV stands, and where the
ranking comes from (`pages.survival`). Claims: the first press scores below the full cache; SnapKV ranks outside the
top `TOP` and below the first tier. The view "front" is the README's: the top `TOP` presses only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..options import option
from ..report.equality import TABLE
from .base import PAGE, Page, Sheet, register

if TYPE_CHECKING:
    from ..report.board import Board


@dataclass(frozen=True)
class BoardOptions:
    equality: str | None = option(None, "A table of comparisons with kvpress 0.5.5 on these runs' task file "
                                        f"(benchmarks/kvpress_check.py --equality writes it; the repository's is {TABLE}), "
                                        "read by the column '= kvpress (cells)' (default none: every press 'not "
                                        "compared').")


@dataclass
class Pooled:
    """A board and where its kvpress comparisons lie."""

    board: Board
    equality: str


def task_tables(board: Board) -> str:
    """Per held task, every press's score at each ratio and its mean over the ratios on that task, each with its
    interval (the press × ratio × task table), in the pooled ranking's order and with its ranks, so the tables read
    side by side."""
    from ..report import leaderboard
    from ..report.board import ranking_table

    examples, order = board.examples, board.ranking()
    tasks, _ = leaderboard.held(examples)
    parts = []
    for task in tasks:
        mine = leaderboard.standings(examples[examples["task"] == task], board.seed)
        means = leaderboard.ranking(examples[examples["task"] == task], board.seed)[["press", "score", "low", "high"]]
        ranked = order[["press", "rank"]].merge(means, on="press")  # the pooled ranks, this task's means
        parts.append(f"**{task}** ({int(mine['examples'].iloc[0])} examples)\n\n" + ranking_table(mine, ranked))
    return "\n\n".join(parts)


def page_sheet(pooled: Pooled) -> Sheet:
    """The whole ranking with intervals, tiers and rank intervals over every example of the held tasks, the same
    ranking over only the examples the full cache answers, the per-task tables, the interval widths, where SnapKV
    stands and where the ranking comes from."""
    from ..report import equality, leaderboard
    from ..report.board import (TOP, facts, filter_table, kvpress_facts, leaders, ranking_table,
                                tier_facts, widths)
    from ..report.survival import reference_in
    from .survival import read_at, survival_sheet

    board = pooled.board
    cells, order = board.standings(), board.ranking()
    answered = board.ranking("answered")
    ranked, named = leaders(order)
    column, kvpress, agreed = kvpress_facts(board, order, equality.ONE, pooled.equality)
    values = {**facts(board), **named, "table": ranking_table(cells, order, kvpress=column),
              "by_task": task_tables(board), "widths": widths(cells), "top": str(TOP),
              **tier_facts(order), "answered": str(len(leaderboard.answered_rows(board.full))),
              "answered_table": filter_table(answered), "answered_first": leaders(answered)[1]["first"]}
    full = float(order.set_index("press").loc["full", "score"])
    tier, reference = ranked["tier"], reference_in(ranked.index)
    claims = {"first-below-full": bool(ranked["score"].iloc[0] < full),
              "reference-outside-top": bool(reference in ranked.index and ranked.loc[reference, "rank"] > TOP),
              "reference-below-top-tier": bool(reference in ranked.index and tier[reference] > 1)}
    where = survival_sheet(read_at(board, None))
    return Sheet({**values, **where.values, **kvpress}, {**claims, **where.claims, **agreed})


def front_sheet(pooled: Pooled) -> Sheet:
    """The front page's: the top TOP presses of the ranking with intervals, beside the full cache."""
    from ..report import equality
    from ..report.board import TOP, facts, kvpress_facts, ranking_table

    board = pooled.board
    cells, order = board.standings(), board.ranking()
    column, kvpress, agreed = kvpress_facts(board, order, equality.ONE, pooled.equality)
    values = {**facts(board), "top": str(TOP), "table": ranking_table(cells, order, TOP, column)}
    return Sheet({**values, **kvpress}, agreed)


class BoardPage(Page):
    """A page ranking pooled task runs' presses on the rows `over` names (`report.leaderboard.FILTERS`)."""

    options = BoardOptions
    over = "held"

    def prepare(self, runs: list[Any], options: BoardOptions) -> Pooled:
        from ..report import leaderboard
        from ..report.board import pooled_board

        board = pooled_board(runs)
        leaderboard.chosen(board.examples, leaderboard.HOLDS, self.over)  # a row to rank on, or one line
        return Pooled(board, options.equality)

    def table(self, prepared: Pooled):
        from ..report.board import ranking_csv

        return ranking_csv(prepared.board.standings(self.over), prepared.board.ranking(self.over))


class LeaderboardPage(BoardPage):
    name = "leaderboard"
    summary = "Task runs of one task file pooled into one ranking of presses, each score with its interval."
    order = 10
    #: docs/leaderboard.md ranks kvpress's two loops in two paragraphs, each on its own runs
    paragraphs = {"leaderboard": PAGE, "leaderboard-query-aware": PAGE, "front-leaderboard": "front"}
    text = """Model {model}, runs pooled: {runs}. The tasks whose full cache answers at least {holds} of their examples:
{held} (left out: {dropped}); over their {total} examples the full cache scores {full}. Presses ranked by their mean
over the ratios: {presses}, in tiers: {tiers}; listed without a rank, as their cache held more than 1 − r of the full
cache's bytes: {unranked}. Equal to kvpress 0.5.5 in every answer compared: {equal_to_kvpress}. The compressed cells'
intervals are {widths} wide.

{table}

## Over only the {answered} examples the full cache answers

{answered_table}

## Per task

{by_task}

## Where the ranking comes from, at r = {survival_ratio}

{survival_table}"""

    def sheet(self, prepared: Pooled, view: str = PAGE) -> Sheet:
        return front_sheet(prepared) if view == "front" else page_sheet(prepared)

    def draw(self, prepared: Pooled):
        """The presses ranked: score per ratio and the mean over ratios on the tasks the full cache holds."""
        from ..report import leaderboard
        from ..reporter import plural

        board = prepared.board
        tasks, dropped = leaderboard.held(board.examples)
        full = board.full[board.full["task"].isin(tasks)]
        title = (f"{board.runs[0].meta['model']['name']}: mean score over "
                 f"{plural(full['example'].nunique(), 'example')} of {plural(len(tasks), 'task')} the full cache "
                 f"answers ({', '.join(tasks)})")
        if dropped:
            title += "\nleft out, the full cache answering below " + f"{leaderboard.HOLDS:g}: " + ", ".join(
                f"{task} ({score:.2f})" for task, score in dropped.items())
        return leaderboard.draw(board.standings(), board.ranking(), title)


register(LeaderboardPage())
