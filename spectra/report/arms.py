"""Two arms of one board, paired by example: the same presses on the same needles under two conditions — two
haystacks (`report.haystacks`: noise against prose) or two models (`report.models`: SmolLM2 against Gemma 3) —
side by side, with what the condition changes.

The rows are both arms' per-example rows with an `arm` column naming the arm (`ARMS` of the calling module, first
and second). Both arms' examples are the same needles, so one set of bootstrap replicates serves both
(`ranks.replicates`: an example's task-stratified Poisson weights depend on its index only), and every difference
is paired over the needles. `compared`: per press and ratio, each arm's score with its 95% interval, the paired
difference second − first, the share of needles whose score changed, and each arm's verdict on the press against
its own full cache — "holds" where the paired difference press − full cache has an interval reaching 0, "loses"
where the interval lies below 0 (the leaderboard's comparison with the reference, `ranks.summary`) — and whether the
verdict flips between the arms (`shown`: the table as the analyses print it). `ranked`: each press's mean over the
ratios and its rank in each arm, and Kendall's τ between the arms' orders with its interval over the same replicates:
whether the ranking is the arm's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..errors import SpectraError
from ..kv.tasks.summary import LEVEL
from . import ranks
from .leaderboard import spans

#: the verdicts on a press at a ratio against its arm's full cache
HOLDS, LOSES = "holds", "loses"


def matched(pooled: dict[str, pd.DataFrame], every: bool = True) -> pd.DataFrame:
    """The examples both arms hold (`pooled`: each arm's pooled rows by arm name, the first first), each the same
    needle in both — the same task at the same depth —, in the first arm's order, as their task and depth indexed by
    example; `every`: each of the first arm's examples must be in the second. One line naming the first example that
    is not, or where none is shared."""
    (one, first), (two, second) = pooled.items()
    needles = first[first["press"] == "full"].drop_duplicates("example").set_index("example")[["task", "depth"]]
    theirs = second[second["press"] == "full"].drop_duplicates("example").set_index("example")[["task", "depth"]]
    missing = needles.index.difference(theirs.index)
    if every and len(missing):
        raise SpectraError(f"the {two} runs lack examples {spans(list(missing))} of the {one} runs: run both arms on "
                           "task files of the same needles (`spectra tasks` with the same --tasks order, --length, "
                           "--samples and --seed)")
    needles = needles[needles.index.isin(theirs.index)]
    if needles.empty:
        raise SpectraError(f"the {one} and {two} runs share no example: run both arms on task files of the same "
                           "needles (`spectra tasks` with the same --tasks order, --length, --samples and --seed)")
    other = theirs.reindex(needles.index)
    differ = needles.index[(other["task"] != needles["task"]) | ~np.isclose(other["depth"], needles["depth"],
                                                                             equal_nan=True)]
    if len(differ):
        where = differ[0]
        raise SpectraError(f"example {where} is {needles.loc[where, 'task']} at depth {needles.loc[where, 'depth']:.3f} "
                           f"in the {one} runs but {other.loc[where, 'task']} at depth {other.loc[where, 'depth']:.3f} "
                           f"in the {two} runs: the arms must hide the same needles")
    return needles


def joined(pooled: dict[str, pd.DataFrame], examples: pd.Index) -> pd.DataFrame:
    """Each arm's pooled rows (`leaderboard.pooled`, by arm name) of `examples`, on the presses and ratios both arms
    ran (the full cache always), as one frame with an `arm` column; one line where no press ran at a ratio in both."""
    cells = [set(map(tuple, rows.loc[rows["press"] != "full", ["press", "ratio"]].to_numpy()))
             for rows in pooled.values()]
    shared = cells[0] & cells[1]
    if not shared:
        raise SpectraError("no press ran at the same ratio in both arms: give runs of the same presses")
    parts = []
    for arm, rows in pooled.items():
        rows = rows[rows["example"].isin(examples)]
        keep = (rows["press"] == "full") | pd.Series(list(zip(rows["press"], rows["ratio"])),
                                                     index=rows.index).isin(shared)
        parts.append(rows[keep].assign(arm=arm))
    return pd.concat(parts, ignore_index=True)


def compared(rows: pd.DataFrame, seed: int, arms: Sequence[str], level: float = LEVEL) -> pd.DataFrame:
    """Per press and ratio (the full cache first, at ratio 0) over the paired examples: examples, then per arm its
    score with 95% interval (`<arm>`, `<arm>_low`, `<arm>_high`) and its verdict against that arm's full cache
    (`<arm>_verdict`); the difference second − first with its paired interval (`delta`, `delta_low`,
    `delta_high`), the share of examples where the arms disagree (`changed`) and whether the verdicts differ
    (`flips`)."""
    first, second = arms
    table = ranks.scores(rows, ["arm", "press", "ratio"])
    boot = ranks.replicates(table, seed)
    low, high = ranks.percentile(boot, level)
    # each cell's paired difference from its own arm's full cache, as the leaderboard takes it
    against_full = {arm: ranks.summary(table, boot, (arm, "full", 0.0), level)["delta_high"].to_numpy()
                    for arm in arms}
    records = []
    for press, ratio in dict.fromkeys((press, ratio) for _, press, ratio in table.cells):
        columns = {arm: table.column((arm, press, ratio)) for arm in arms}
        record = {"press": press, "ratio": ratio, "examples": len(table.values)}
        for arm, column in columns.items():
            loses = against_full[arm][column] < 0
            record.update({arm: table.values[:, column].mean(), f"{arm}_low": low[column],
                           f"{arm}_high": high[column],
                           f"{arm}_verdict": "" if press == "full" else (LOSES if loses else HOLDS)})
        one, two = table.values[:, columns[first]], table.values[:, columns[second]]
        delta_low, delta_high = ranks.percentile(boot[:, [columns[second]]] - boot[:, [columns[first]]], level)
        record.update({"delta": (two - one).mean(), "delta_low": delta_low[0], "delta_high": delta_high[0],
                       "changed": float((two != one).mean()),
                       "flips": record[f"{first}_verdict"] != record[f"{second}_verdict"]})
        records.append(record)
    return pd.DataFrame(records)


def ranked(rows: pd.DataFrame, seed: int, arms: Sequence[str],
           level: float = LEVEL) -> tuple[pd.DataFrame, dict[str, float]]:
    """(per press its mean over the ratios, its rank and its tier in each arm (`<arm>_score`, `<arm>_rank`,
    `<arm>_tier`: `ranks.tiers` of Holm-corrected paired tests among the presses, as the leaderboard's, so tier 1 is
    the presses no test separates from the first), the presses in the second arm's order; Kendall's τ between the
    two arms' orders with its 95% interval over the same bootstrap replicates)."""
    from scipy.stats import kendalltau, rankdata

    first, second = arms
    pressed = rows[rows["press"] != "full"]
    unit = ranks.units(pressed)
    means = pressed.groupby(["arm", "press", *unit], sort=False).agg(score=("score", "mean"),
                                                                     task=("task", "first")).reset_index()
    table = ranks.scores(means, ["arm", "press"])
    boot = ranks.replicates(table, seed)
    presses = list(dict.fromkeys(press for _, press in table.cells))
    columns = {arm: [table.column((arm, press)) for press in presses] for arm in arms}
    score = {arm: table.values[:, columns[arm]].mean(axis=0) for arm in arms}
    order = pd.DataFrame({"press": presses, **{f"{arm}_score": score[arm] for arm in arms},
                          **{f"{arm}_rank": rankdata(-np.round(score[arm], ranks.DECIMALS), method="min").astype(int)
                             for arm in arms}})
    for arm in arms:  # `ranks.tiers` reads the presses in rank order; each tier goes back to its press's row
        by_rank = np.argsort(order[f"{arm}_rank"].to_numpy(), kind="stable")
        tier = np.empty(len(presses), dtype=int)
        tier[by_rank] = ranks.tiers(ranks.separated(table, boot, [columns[arm][index] for index in by_rank], level))
        order[f"{arm}_tier"] = tier
    tau = kendalltau(score[first], score[second]).statistic
    taus = np.array([kendalltau(row[columns[first]], row[columns[second]]).statistic for row in boot])
    taus = taus[np.isfinite(taus)]
    tail = (1 - level) / 2
    interval = (np.quantile(taus, tail), np.quantile(taus, 1 - tail)) if len(taus) else (np.nan, np.nan)
    return (order.sort_values([f"{second}_rank", f"{first}_rank"], kind="stable").reset_index(drop=True),
            {"tau": float(tau), "low": float(interval[0]), "high": float(interval[1]), "presses": len(presses)})


def shown(table: pd.DataFrame, arms: Sequence[str]) -> pd.DataFrame:
    """`compared`'s table as printed: per press and ratio each arm's score [95% interval], the paired difference
    second − first [95% interval], the share of examples that changed, both verdicts and whether they flip."""
    from .evaluate import with_interval

    first, second = arms
    scored = {arm: [with_interval(*v) for v in zip(table[arm], table[f"{arm}_low"], table[f"{arm}_high"])]
              for arm in arms}
    return pd.DataFrame({
        "press": table["press"], "ratio": table["ratio"], **scored,
        f"{second} − {first}": [with_interval(*v, sign="+") for v in zip(table["delta"], table["delta_low"],
                                                                          table["delta_high"])],
        "changed": table["changed"],
        "verdicts": [f"{a or '—'} / {b or '—'}" for a, b in zip(table[f"{first}_verdict"],
                                                                table[f"{second}_verdict"])],
        "flips": table["flips"].map({True: "yes", False: ""})})


def tau_text(tau: dict[str, float]) -> str:
    """Kendall's τ as written: 'τ = 0.62 [0.41–0.80] over 20 presses', or why there is none (every press ties in an
    arm: its ranking orders nothing)."""
    if not np.isfinite(tau["tau"]):
        return f"τ undefined over {tau['presses']} presses: every press ties in one arm, whose ranking orders nothing"
    return f"τ = {tau['tau']:.2f} [{tau['low']:.2f}–{tau['high']:.2f}] over {tau['presses']} presses"
