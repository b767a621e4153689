"""The renderers of the leaderboard: docs/leaderboard.md's tables and the front page's top of the ranking.

The leaderboard is several `spectra evaluate` runs of one task file (a press list too long for one sitting),
pooled by `spectra.report.leaderboard`: per press and ratio the mean score over the examples of the tasks whose full
cache holds, with its 95% interval over examples, and the ranking by the mean over the ratios, each rank with its
95% interval and its tier (`spectra.report.ranks`). Each board is written under both filters, named: the
single-question board over every example of the held tasks and over only the examples the full cache answers, the
many-question board over the questions the full cache answers and over every question. The values here are those
tables written out — ranks, tiers, scores, intervals and their widths, the full cache beside them — so the prose
around them quotes the runs, never a number typed by hand. The main tables carry the column `= kvpress (cells)`: per
press the answers equal to kvpress 0.5.5's of those compared, read from the committed comparisons
(results/kvpress-equality.csv, `spectra.report.equality`), and the presses a page may call equal to kvpress are those
whose every compared answer is (`equal_to_kvpress`). The runs are read as published (`spectra publish`: results/…,
each file's sha256 checked) or from their run directories alike.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from readme_values import RenderError, Runs, interval, listed, table, two
from slots import Rendered
from spectra.errors import SpectraError
from spectra.report import equality, leaderboard, survival
from spectra.report.evaluate import TaskRun

#: how many presses the front page lists from the top of the ranking
TOP = 5
#: the press every KV-cache paper compares against, whose place in the ranking is named
REFERENCE = survival.REFERENCE
#: a needle "near the end" of the context lies at least this deep (0 first token, 1 last): in reach of a window
LATE = 0.9
#: a press keeps "part" of the needle where it answers when its mean share of the needle's tokens is below this
PART = 0.9
#: the committed comparisons with kvpress 0.5.5 the tables' column `= kvpress (cells)` reads (`report.equality`)
EQUALITY = Path(__file__).resolve().parent.parent / equality.TABLE
#: that column's heading
KVPRESS = "= kvpress (cells)"


def pooled_runs(runs: Runs) -> tuple[list[TaskRun], pd.DataFrame, int]:
    """(the block's task runs of `spectra evaluate`, their pooled per-example rows, the seed)."""
    found = [run for run in runs.get("evaluate", []) if isinstance(run, TaskRun)]
    if not found:
        raise RenderError("the block must run `spectra evaluate` on a task file at least once")
    try:
        examples = leaderboard.pooled(found)
    except SpectraError as error:
        raise RenderError(str(error)) from None
    return found, examples, leaderboard.seed_of(found)


def with_interval(score: float, low: float, high: float) -> str:
    """'0.87 [0.80–0.93]'."""
    return f"{two(score)} [{interval(low, high)}]"


def facts(found: list[TaskRun], examples: pd.DataFrame, order: pd.DataFrame) -> dict[str, str]:
    """The values every leaderboard paragraph quotes: the model, the length, the examples, the held tasks and the full
    cache's mean over them."""
    tasks, dropped = leaderboard.held(examples)
    full = order.set_index("press").loc["full"]
    per_task = examples[(examples["press"] == "full") & examples["task"].isin(tasks)].groupby("task").size()
    return {"model": found[0].meta["model"]["name"], "length": str(int(examples["length"].max())),
            "examples": str(int(per_task.min())), "total": str(int(per_task.sum())), "tasks": str(len(tasks)),
            "held": listed([f"`{task}`" for task in tasks]), "holds": f"{leaderboard.HOLDS:g}",
            "dropped": listed([f"`{task}` ({two(score)})" for task, score in dropped.items()]) or "none",
            "full": with_interval(full["score"], full["low"], full["high"]),
            "presses": str(int(order["rank"].notna().sum()) - 1), "runs": str(len(found)),
            "unranked": unranked(examples, order)}


def rank_text(rank) -> str:
    """A rank as written in the tables: '—' for a press that did not compress as far as r asks (not ranked)."""
    return "—" if pd.isna(rank) else str(int(rank))


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


def rank_interval(low, high) -> str:
    """A rank's 95% interval, '3–9' (or '3' where it never moved); '—' for a press without a rank."""
    if pd.isna(low):
        return "—"
    return str(int(low)) if low == high else f"{int(low)}–{int(high)}"


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


def kvpress_facts(found: list[TaskRun], order: pd.DataFrame, questions: str) -> tuple[dict[str, str], Rendered]:
    """The column `= kvpress (cells)` per press of `order` in the runs' loop and kind of records (`equality.column`),
    and the values and claim on it: `equal_to_kvpress`, the presses whose every compared answer is kvpress's at every
    ratio compared (`equality.equal_everywhere`: the only ones the prose may call equal); `kvpress_peers`, how many
    presses kvpress has; `kvpress_compared`, how many of them were compared; the claim `every-peer-equal`, that every
    press kvpress has was compared and is equal."""
    try:
        compared = equality.read(EQUALITY)
    except SpectraError as error:
        raise RenderError(str(error)) from None
    aware = bool(found[0].meta.get("query_aware", False))
    presses = list(order["press"])
    column = equality.column(compared, presses, aware, questions)
    equal = equality.equal_everywhere(compared, presses, aware, questions)
    peers = [press for press in presses if press != "full" and column[press] != equality.ABSENT]
    done = [press for press in peers if column[press] != equality.UNCOMPARED]
    values = {"equal_to_kvpress": listed([f"`{press}`" for press in equal]) or "none",
              "kvpress_peers": str(len(peers)), "kvpress_compared": str(len(done))}
    return column, Rendered(values, {"every-peer-equal": bool(peers) and len(equal) == len(peers)})


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
    return {f"{prefix}pairs": str(len(ranked) * (len(ranked) - 1) // 2),
            f"{prefix}tiers": str(int(ranked["tier"].max())) if len(ranked) else "0",
            f"{prefix}top_tier": listed([f"`{press}`" for press in tier[tier == 1].index]),
            f"{prefix}reference_tier": str(int(tier[REFERENCE])) if REFERENCE in tier.index else "—",
            f"{prefix}rank_widths": f"a median of {widths.median():g} and at most {widths.max():g}" if len(ranked)
            else "—"}


def task_tables(examples: pd.DataFrame, order: pd.DataFrame, seed: int) -> str:
    """Per held task, every press's score at each ratio and its mean over the ratios on that task, each with its
    interval (the press × ratio × task table), in the pooled ranking's order and with its ranks, so the tables read
    side by side."""
    tasks, _ = leaderboard.held(examples)
    parts = []
    for task in tasks:
        mine = leaderboard.standings(examples[examples["task"] == task], seed)
        means = leaderboard.ranking(examples[examples["task"] == task], seed)[["press", "score", "low", "high"]]
        ranked = order[["press", "rank"]].merge(means, on="press")  # the pooled ranks, this task's means
        parts.append(f"**{task}** ({int(mine['examples'].iloc[0])} examples)\n\n" + ranking_table(mine, ranked))
    return "\n\n".join(parts)


def widths(cells: pd.DataFrame) -> str:
    """The 95% intervals' widths over the compressed cells, as 'low–high (median m)'."""
    width = (cells["high"] - cells["low"])[cells["press"] != "full"]
    return f"{two(width.min())}–{two(width.max())} (median {two(width.median())})"


def share(value: float) -> str:
    """A share with two decimals, '—' where there was nothing to average (no answer, no failure)."""
    return "—" if pd.isna(value) else two(value)


def survival_facts(found: list[TaskRun], examples: pd.DataFrame, order: pd.DataFrame) -> Rendered:
    """Where the ranking comes from (`spectra.report.survival`): per press read (the best that evict tokens, and
    SnapKV), at kvpress's middle ratio, the full cache's answers it kept, its failures with a layer that lost the whole
    needle from every key/value head, the layer that lost it first most often, and the needle it kept where it
    answered and where it failed; the shallowest needle among SnapKV's kept answers. Claims: every best press read
    answers keeping only part of the needle (< PART of its tokens over layers and heads); SnapKV keeps answers only
    where the needle lies near the end of the context (depth ≥ LATE), within reach of the window it scores by."""
    needle = leaderboard.pooled_needle(found)
    chosen = survival.survivors(examples, order, needle)
    if not chosen:
        raise RenderError(f"no press evicted tokens at ratio {survival.SURVIVAL_RATIO:g}: nothing to say where the "
                          "ranking comes from")
    read = survival.survival(examples, survival.pooled_evicted(found), chosen)
    ranks = order.set_index("press")["rank"]
    rows = [[rank_text(ranks[row.press]), f"`{row.press}`", f"{row.kept} of {row.answered}",
             f"{row.whole_layer} of {row.failed}", "—" if row.first_layer < 0 else str(row.first_layer),
             f"{share(row.needle_answered)} / {share(row.needle_failed)}"]
            for row in read.itertuples()]
    best = read[(read["press"] != REFERENCE) & (read["kept"] > 0)]
    answered = leaderboard.answered_rows(examples)
    kept = answered[(answered["press"] == REFERENCE) & (answered["ratio"] == survival.SURVIVAL_RATIO)
                    & (answered["score"] >= 1)]
    shallowest = float(kept["depth"].min()) if len(kept) and "depth" in kept else float("nan")
    values = {"survival_ratio": f"{survival.SURVIVAL_RATIO:g}", "survival_presses": str(len(chosen)),
              "survival_table": table(["rank", "press", "answers kept", "failures with a layer that lost the needle",
                                       "that layer, most often", "needle kept: answered / failed"], rows),
              "reference_depth": share(shallowest), "reference_kept": str(len(kept))}
    claims = {"leaders-keep-part": bool(len(best) and (best["needle_answered"] < PART).all()),
              "reference-answers-late": bool(shallowest >= LATE)}
    return Rendered(values, claims)


def leaders(order: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the ranking without the full cache and the unranked presses, indexed by press; the values naming its first
    press, that press's score and SnapKV's rank — '—' where SnapKV is not ranked)."""
    ranked = order[(order["press"] != "full") & order["rank"].notna()].set_index("press")
    return ranked, {"first": f"`{ranked.index[0]}`", "first_score": two(ranked["score"].iloc[0]),
                    "reference_rank": str(int(ranked.loc[REFERENCE, "rank"])) if REFERENCE in ranked.index else "—"}


def leaderboard_page(runs: Runs) -> Rendered:
    """docs/leaderboard.md: the whole ranking with intervals, tiers and rank intervals over every example of the held
    tasks, the same ranking over only the examples the full cache answers, the per-task tables, the interval widths,
    and where SnapKV stands."""
    found, examples, seed = pooled_runs(runs)
    cells, order = leaderboard.standings(examples, seed), leaderboard.ranking(examples, seed)
    answered = leaderboard.ranking(examples, seed, over="answered")
    ranked, named = leaders(order)
    column, kvpress = kvpress_facts(found, order, equality.ONE)
    values = {**facts(found, examples, order), **named, "table": ranking_table(cells, order, kvpress=column),
              "by_task": task_tables(examples, order, seed), "widths": widths(cells), "top": str(TOP),
              **tier_facts(order), "answered": str(len(leaderboard.answered_rows(
                  examples[examples["press"] == "full"]))),
              "answered_table": filter_table(answered), "answered_first": leaders(answered)[1]["first"]}
    full = float(order.set_index("press").loc["full", "score"])
    tier = ranked["tier"]
    claims = {"first-below-full": bool(ranked["score"].iloc[0] < full),
              "reference-outside-top": bool(REFERENCE in ranked.index and ranked.loc[REFERENCE, "rank"] > TOP),
              "reference-below-top-tier": bool(REFERENCE in ranked.index and tier[REFERENCE] > 1)}
    where = survival_facts(found, examples, order)
    return Rendered({**values, **where.values, **kvpress.values}, {**claims, **where.claims, **kvpress.claims})


def front_leaderboard(runs: Runs) -> Rendered:
    """The front page: the top TOP presses of the ranking with intervals, beside the full cache."""
    found, examples, seed = pooled_runs(runs)
    cells, order = leaderboard.standings(examples, seed), leaderboard.ranking(examples, seed)
    column, kvpress = kvpress_facts(found, order, equality.ONE)
    values = {**facts(found, examples, order), "top": str(TOP), "table": ranking_table(cells, order, TOP, column)}
    return Rendered({**values, **kvpress.values}, kvpress.claims)


def questions_page(runs: Runs) -> Rendered:
    """docs/leaderboard.md's many-question table: the runs of a many-question task file pooled, presses ranked on the
    questions the full cache answers (no task holds as a whole there), each cell the share of those answers kept,
    with tiers and rank intervals; and the ranking over every question. Claims: the full cache scores below HOLDS
    over every question (why the answered ones are the scope); the first press loses some of them."""
    found, examples, seed = pooled_runs(runs)
    try:
        cells = leaderboard.standings(examples, seed, over="answered")
        order = leaderboard.ranking(examples, seed, over="answered")
        every = leaderboard.ranking(examples, seed, over="all")
    except SpectraError as error:
        raise RenderError(str(error)) from None
    from spectra.kv.tasks.summary import task_scores

    full = examples[examples["press"] == "full"]
    raw = task_scores(full, seed, by=()).iloc[0]  # the full cache's score over every question, answered or not
    ranked, named = leaders(order)
    column, kvpress = kvpress_facts(found, order, equality.SEVERAL)
    values = {**named, "model": found[0].meta["model"]["name"], "length": str(int(examples["length"].max())),
              "records": str(full["example"].nunique()), "questions": str(len(full)),
              "tasks": listed([f"`{task}`" for task in dict.fromkeys(full["task"])]),
              "full": with_interval(raw["score"], raw["low"], raw["high"]),
              "answered": str(len(leaderboard.answered_rows(full))), "presses": str(len(ranked)),
              "unranked": unranked(examples, order), **tier_facts(order),
              "table": ranking_table(cells, order, kvpress=column), "widths": widths(cells),
              "holds": f"{leaderboard.HOLDS:g}", "all_table": filter_table(every),
              "all_first": leaders(every)[1]["first"], **kvpress.values}
    return Rendered(values, {"full-below-holds": bool(raw["score"] < leaderboard.HOLDS),
                             "first-loses-some": bool(ranked["score"].iloc[0] < 1.0), **kvpress.claims})
