"""What the leaderboard's pages share: the pooled board of task runs, its rankings made once, and the tables and
values each page writes of them.

A board is several `spectra evaluate` runs of one task file pooled (`report.leaderboard.pooled`, checked there); its
rankings and standings under each filter (`leaderboard.FILTERS`) are bootstrapped once and kept (`Board.ranking`,
`Board.standings`), so a page's values, table and picture read the same numbers. The tables are markdown
(`report.markdown`): the ranking with each cell's interval, tier and rank interval (`ranking_table`), the short one
under a board's other filter (`filter_table`), the values every board quotes (`facts`, `tier_facts`, `leaders`,
`widths`, `unranked`) and the column `= kvpress (cells)` read from the committed comparisons with kvpress 0.5.5
(`kvpress_facts`, `report.equality`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SpectraError
from . import equality, leaderboard, survival
from .evaluate import TaskRun
from .markdown import listed, rank_interval, rank_text, table, two, with_interval

#: how many presses the front page lists from the top of the ranking
TOP = 5
#: the tables' column of answers equal to kvpress 0.5.5's, and its heading
KVPRESS = "= kvpress (cells)"


@dataclass
class Board:
    """Task runs of one task file pooled (`leaderboard.pooled`): their per-example rows and seed; each filter's
    ranking and standings made on first use and kept."""

    runs: list[TaskRun]
    examples: pd.DataFrame
    seed: int
    made: dict[tuple[str, str], pd.DataFrame] = field(default_factory=dict, repr=False)

    def ranking(self, over: str = "held") -> pd.DataFrame:
        if ("ranking", over) not in self.made:
            self.made["ranking", over] = leaderboard.ranking(self.examples, self.seed, over=over)
        return self.made["ranking", over]

    def standings(self, over: str = "held") -> pd.DataFrame:
        if ("standings", over) not in self.made:
            self.made["standings", over] = leaderboard.standings(self.examples, self.seed, over=over)
        return self.made["standings", over]

    @property
    def full(self) -> pd.DataFrame:
        """The full cache's rows."""
        return self.examples[self.examples["press"] == "full"]


def pooled_board(runs: Sequence[Any]) -> Board:
    """The runs pooled into a board: each a task run (one line naming the first that is not), then
    `leaderboard.pooled`'s checks (one line naming the runs and what differs)."""
    if not runs:
        raise SpectraError("a board pools one or more task runs of spectra evaluate: give their run directories")
    for run in runs:
        if not isinstance(run, TaskRun):
            raise SpectraError(f"{run.path} is not a task run of spectra evaluate (a task file made by spectra tasks)")
    found = list(runs)
    return Board(found, leaderboard.pooled(found), leaderboard.seed_of(found))


def facts(board: Board) -> dict[str, str]:
    """The values every leaderboard paragraph quotes: the model, the length, the examples, the held tasks and the full
    cache's mean over them."""
    examples, order = board.examples, board.ranking()
    tasks, dropped = leaderboard.held(examples)
    full = order.set_index("press").loc["full"]
    per_task = examples[(examples["press"] == "full") & examples["task"].isin(tasks)].groupby("task").size()
    return {"model": board.runs[0].meta["model"]["name"], "length": str(int(examples["length"].max())),
            "examples": str(int(per_task.min())), "total": str(int(per_task.sum())), "tasks": str(len(tasks)),
            "held": listed([f"`{task}`" for task in tasks]), "holds": f"{leaderboard.HOLDS:g}",
            "dropped": listed([f"`{task}` ({two(score)})" for task, score in dropped.items()]) or "none",
            "full": with_interval(full["score"], full["low"], full["high"]),
            "presses": str(int(order["rank"].notna().sum()) - 1), "runs": str(len(board.runs)),
            "unranked": unranked(examples, order)}


def unranked(examples: pd.DataFrame, order: pd.DataFrame) -> str:
    """The presses listed without a rank, each with the share of the cache's bytes it stored at the lowest and the
    highest ratio, or at every ratio where that share is one ('none' where every press compressed as far as r
    asks)."""
    out = order.loc[order["rank"].isna(), "press"]
    stored = leaderboard.stored_shares(examples[examples["press"].isin(out)])
    parts = []
    for press in out:
        shares = stored[press]
        written = [two(share) for share in shares]
        parts.append(f"`{press}` ({written[0]} of the bytes at every ratio)" if len(set(written)) == 1 else
                     f"`{press}` ({written[0]} of the bytes at r = {shares.index[0]:g}, {written[-1]} at r = "
                     f"{shares.index[-1]:g})")
    return listed(parts) or "none"


def ranking_table(cells: pd.DataFrame, order: pd.DataFrame, top: int | None = None,
                  kvpress: dict[str, str] | None = None) -> str:
    """Rank, tier, press, the score at each ratio and the mean over ratios, each with its interval, and the rank's
    95% interval (tier and rank interval where `order` has them), and with `kvpress` (`equality.column`) the answers
    equal to kvpress 0.5.5's of those compared; the full cache first."""
    ratios = sorted(set(cells["ratio"]) - {0.0})
    by_cell = cells.set_index(["press", "ratio"])
    tiered = "tier" in order.columns
    rows = []
    for _, row in order.iloc[:None if top is None else top + 1].iterrows():
        press = row["press"]
        scores = []
        for ratio in ratios:
            key = (press, 0.0 if press == "full" else ratio)
            scores.append(with_interval(*by_cell.loc[key, ["score", "low", "high"]]) if key in by_cell.index else "")
        name = "full cache" if press == "full" else f"`{press}`"
        full = press == "full"
        tier = ["" if full else rank_text(row["tier"])] if tiered else []
        moved = ["" if full else rank_interval(row["rank_low"], row["rank_high"])] if tiered else []
        rows.append(["" if full else rank_text(row["rank"]), *tier, name, *scores,
                     with_interval(row["score"], row["low"], row["high"]), *moved,
                     *([kvpress[press]] if kvpress is not None else [])])
    return table(["rank", *(["tier"] * tiered), "press", *(f"r = {ratio:g}" for ratio in ratios), "mean over r",
                  *(["rank (95%)"] * tiered), *([KVPRESS] if kvpress is not None else [])], rows)


def kvpress_facts(board: Board, order: pd.DataFrame, questions: str,
                  path: str | Path | None) -> tuple[dict[str, str], dict[str, str], dict[str, bool]]:
    """The column `= kvpress (cells)` per press of `order` in the runs' loop and kind of records (`equality.column`,
    the comparisons read from `path`; None: none, every press not compared), and the values and claim on it: `equal_to_kvpress`, the presses whose every
    compared answer is kvpress's at every ratio compared (`equality.equal_everywhere`: the only ones the prose may
    call equal); `kvpress_peers`, how many presses kvpress has; `kvpress_compared`, how many of them were compared;
    the claim `every-peer-equal`, that every press kvpress has was compared and is equal."""
    compared = equality.read(path) if path is not None else pd.DataFrame(columns=list(equality.COLUMNS))
    aware = bool(board.runs[0].meta.get("query_aware", False))
    presses = list(order["press"])
    column = equality.column(compared, presses, aware, questions)
    equal = equality.equal_everywhere(compared, presses, aware, questions)
    peers = [press for press in presses if press != "full" and column[press] != equality.ABSENT]
    done = [press for press in peers if column[press] != equality.UNCOMPARED]
    values = {"equal_to_kvpress": listed([f"`{press}`" for press in equal]) or "none",
              "kvpress_peers": str(len(peers)), "kvpress_compared": str(len(done))}
    return column, values, {"every-peer-equal": bool(peers) and len(equal) == len(peers)}


def filter_table(order: pd.DataFrame) -> str:
    """The ranking under a board's other filter, short: rank, tier, press, the mean over r with its interval and the
    rank's 95% interval; the full cache first."""
    rows = [["" if row.press == "full" else rank_text(row.rank), "" if row.press == "full" else rank_text(row.tier),
             "full cache" if row.press == "full" else f"`{row.press}`", with_interval(row.score, row.low, row.high),
             "" if row.press == "full" else rank_interval(row.rank_low, row.rank_high)]
            for row in order.itertuples()]
    return table(["rank", "tier", "press", "mean over r", "rank (95%)"], rows)


def tier_facts(order: pd.DataFrame, prefix: str = "") -> dict[str, str]:
    """The values the tiers' sentences quote: the pairs tested, how many tiers, the first tier's presses, SnapKV's
    tier, and how many ranks the rank intervals cover (high − low + 1: median and widest)."""
    ranked = order[(order["press"] != "full") & order["rank"].notna()]
    widths = (ranked["rank_high"] - ranked["rank_low"] + 1).astype(float)
    tier = ranked.set_index("press")["tier"]
    reference = survival.reference_in(tier.index)
    return {f"{prefix}pairs": str(len(ranked) * (len(ranked) - 1) // 2),
            f"{prefix}tiers": str(int(ranked["tier"].max())) if len(ranked) else "0",
            f"{prefix}top_tier": listed([f"`{press}`" for press in tier[tier == 1].index]),
            f"{prefix}reference_tier": str(int(tier[reference])) if reference in tier.index else "—",
            f"{prefix}rank_widths": f"a median of {widths.median():g} and at most {widths.max():g}" if len(ranked)
            else "—"}


def widths(cells: pd.DataFrame) -> str:
    """The 95% intervals' widths over the compressed cells, as 'low–high (median m)'."""
    width = (cells["high"] - cells["low"])[cells["press"] != "full"]
    return f"{two(width.min())}–{two(width.max())} (median {two(width.median())})"


def leaders(order: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the ranking without the full cache and the unranked presses, indexed by press; the values naming its first
    press, that press's score and SnapKV's rank — '—' where SnapKV is not ranked)."""
    ranked = order[(order["press"] != "full") & order["rank"].notna()].set_index("press")
    reference = survival.reference_in(ranked.index)
    return ranked, {"first": f"`{ranked.index[0]}`", "first_score": two(ranked["score"].iloc[0]),
                    "reference_rank": str(int(ranked.loc[reference, "rank"])) if reference in ranked.index else "—"}


def ranking_csv(cells: pd.DataFrame, order: pd.DataFrame) -> pd.DataFrame:
    """A board's ranking as one tidy table: per press (in rank order) and ratio, the cell's score with its interval
    and the full cache's, beside the press's rank, tier, rank interval and mean over the ratios (ratio 'mean')."""
    columns = ["press", "rank", "tier", "rank_low", "rank_high"]
    ranked = order[[column for column in columns if column in order.columns]]
    means = order[["press", "score", "low", "high"]].assign(ratio="mean")
    scored = pd.concat([cells[["press", "ratio", "score", "low", "high"]].astype({"ratio": object}), means],
                       ignore_index=True)
    return ranked.merge(scored, on="press", how="left")
