"""The leaderboard's statistics: task-stratified, paired Poisson-bootstrap replicates of every cell's mean score, per
press a 95% interval on its rank, and tiers that pairwise tests separate.

A leaderboard's table holds, per unit (an example, or one question of a many-question record) and cell (a press at
a ratio, or a press's mean over its ratios), a score (`Scores`). Replicate b weighs record i by the b-th Poisson(1)
draw seeded by (run seed, Domain.BOOTSTRAP, i) (`kv.tasks.summary.poisson_weights`: a record's weights depend on
its index in the task file only), the same weights for every cell, so differences are paired; and it is stratified
by task: each task's weighted mean, combined with the task's fixed share of the units (n_t / N), so a replicate
resamples the examples within each task and never the tasks' mix (`replicates`). The point estimate is the plain
mean over units. A replicate where some task draws no weight is left out, for every cell alike.

`summary`: per cell its mean and 95% percentile interval, and the paired difference from a reference cell (the full
cache) with its interval. Where every unit of a cell scores 0, or every one 1, the bootstrap has nothing to vary
(it would say 0.00 [0.00–0.00]): the interval is then Clopper–Pearson's over the cell's records (records, not
questions: a record's questions are not independent trials; with scores in [0, 1] the binomial bound holds for a
mean too), and a difference that is 0 on every unit gets ± that bound's upper end.
`rank_intervals`: per cell the 2.5% and 97.5% quantiles of its rank among the cells over the replicates (ties
share the best rank). `separated`: per pair of cells a two-sided test of their paired difference d, z = d / se with
se the standard deviation of d over the replicates, p = 2 Φ(−|z|) (where d does not vary over the replicates, the
exact sign test over the records that differ), Holm's step-down over all pairs (`holm`); a pair is separated where
its adjusted p is below 1 − level. The p-value comes from the replicates' spread rather than from counting them:
38 presses make 703 pairs, and Holm's first threshold 0.05 / 703 lies below the smallest p that a count over 2000
replicates can give. `tiers`: the ranking is cut between two neighbours only where every cell above the cut is
separated from every cell below it, so a cell shares a tier with every cell the tests do not separate from it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import SpectraError
from ..kv.tasks.summary import LEVEL, REPLICATES, poisson_weights
from ..stats import clopper_pearson

#: decimals the replicates' means are rounded to, so that cells with the same score on every unit tie exactly (a
#: matrix product may round two equal columns differently in the last bit)
DECIMALS = 12
#: the columns of `summary` after the cell's keys
COLUMNS = ("examples", "score", "low", "high", "full", "delta", "delta_low", "delta_high", "bytes_share")


def units(rows: pd.DataFrame) -> list[str]:
    """The columns naming a unit: example, and question where a record asks several."""
    return ["example", "question"] if "question" in rows.columns else ["example"]


@dataclass(frozen=True)
class Scores:
    """Per unit (rows) and cell (columns) the score, with each unit's record (example) and task."""

    values: np.ndarray
    cells: list[Hashable]
    records: np.ndarray
    strata: np.ndarray
    bytes_share: np.ndarray

    def column(self, cell: Hashable) -> int:
        return self.cells.index(cell)


def scores(rows: pd.DataFrame, cell: Sequence[str]) -> Scores:
    """The per-example rows (`cell`: the columns naming a cell; example, score, task, and question where there is
    one) as units × cells, the cells in order of appearance; every cell must score every unit (one line naming the
    first that does not)."""
    unit, cell = units(rows), list(cell)
    indexed = rows.set_index([*unit, *cell])
    if indexed.index.has_duplicates:
        raise SpectraError(f"a cell scores some example twice: {indexed.index[indexed.index.duplicated()][0]}")
    wide = indexed["score"].unstack(cell)
    order = list(dict.fromkeys(rows[cell[0]] if len(cell) == 1 else map(tuple, rows[cell].to_numpy())))
    wide = wide.reindex(columns=order)
    missing = wide.isna()
    if missing.to_numpy().any():
        first = missing.any().idxmax()
        raise SpectraError(f"the cell {first} scores {int((~missing[first]).sum())} of the {len(wide)} examples the "
                           "others score: a leaderboard ranks every cell on the same examples")
    strata = rows.groupby(unit)["task"].first().reindex(wide.index) if "task" in rows.columns else None
    share = (rows.groupby(cell, sort=False)["bytes_share"].mean().reindex(order) if "bytes_share" in rows.columns
             else pd.Series(np.nan, index=order))
    return Scores(wide.to_numpy(dtype=np.float64), order, wide.index.get_level_values("example").to_numpy(),
                  np.zeros(len(wide), int) if strata is None else strata.to_numpy(), share.to_numpy(dtype=float))


def replicates(table: Scores, seed: int, count: int = REPLICATES) -> np.ndarray:
    """(replicates used, cells): the task-stratified Poisson-bootstrap means of every cell (see the module
    docstring), rounded to DECIMALS."""
    records = np.unique(table.records)
    weights = poisson_weights(records, seed, count)[:, np.searchsorted(records, table.records)]
    total = np.zeros((count, table.values.shape[1]))
    used = np.ones(count, dtype=bool)
    for task in pd.unique(table.strata):
        inside = table.strata == task
        mass = weights[:, inside].sum(axis=1)
        used &= mass > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            total += inside.mean() * (weights[:, inside] @ table.values[inside]) / mass[:, None]
    return np.round(total[used], DECIMALS)


def percentile(boot: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column the (1 − level)/2 and (1 + level)/2 quantiles of the replicates (NaN without any)."""
    if not len(boot):
        return np.full(boot.shape[1], np.nan), np.full(boot.shape[1], np.nan)
    tail = (1 - level) / 2
    return np.quantile(boot, tail, axis=0), np.quantile(boot, 1 - tail, axis=0)


def summary(table: Scores, boot: np.ndarray, reference: Hashable, level: float = LEVEL) -> pd.DataFrame:
    """Per cell (`cell`, its key, in the table's order): `COLUMNS`, the difference taken from the `reference` cell
    unit by unit (see the module docstring for the intervals)."""
    values, records = table.values, len(np.unique(table.records))
    score = values.mean(axis=0)
    low, high = percentile(boot, level)
    agree = (values == values[:1]).all(axis=0) & np.isin(values[0], (0.0, 1.0))
    exact_low, exact_high = clopper_pearson(np.where(values[0] == 1.0, records, 0), records, level)
    low, high = np.where(agree, exact_low, low), np.where(agree, exact_high, high)
    base = table.column(reference)
    delta = values - values[:, [base]]
    delta_low, delta_high = percentile(boot - boot[:, [base]], level)
    same = (delta == 0).all(axis=0) & agree & agree[base]
    bound = clopper_pearson(0, records, level)[1]
    delta_low, delta_high = np.where(same, -bound, delta_low), np.where(same, bound, delta_high)
    return pd.DataFrame({"cell": table.cells, "examples": len(values), "score": score, "low": low, "high": high,
                         "full": score[base], "delta": delta.mean(axis=0), "delta_low": delta_low,
                         "delta_high": delta_high, "bytes_share": table.bytes_share})


def rank_intervals(boot: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Per column of `boot` the (1 − level)/2 and (1 + level)/2 quantiles (inverted CDF: ranks that occur) of its
    rank among the columns over the replicates, 1 the highest mean, ties sharing the best rank."""
    from scipy.stats import rankdata

    if not len(boot):
        return np.full(boot.shape[1], np.nan), np.full(boot.shape[1], np.nan)
    ranks = rankdata(-boot, method="min", axis=1)
    tail = (1 - level) / 2
    return (np.quantile(ranks, tail, axis=0, method="inverted_cdf"),
            np.quantile(ranks, 1 - tail, axis=0, method="inverted_cdf"))


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: sorted ascending, the k-th (from 0) of m is max over j ≤ k of
    min(1, (m − j) p₍ⱼ₎); a hypothesis is rejected at α where its adjusted p is below α, which holds the chance of
    any false rejection among all m at most α."""
    pvalues = np.asarray(pvalues, dtype=float)
    order = np.argsort(pvalues, kind="stable")
    steps = np.minimum(1.0, np.maximum.accumulate((len(pvalues) - np.arange(len(pvalues))) * pvalues[order]))
    adjusted = np.empty_like(pvalues)
    adjusted[order] = steps
    return adjusted


def pair_pvalue(table: Scores, boot: np.ndarray, first: int, second: int) -> float:
    """The two-sided p-value of the paired difference between columns `first` and `second` (module docstring)."""
    from scipy.stats import binomtest, norm

    point = round(float(table.values[:, first].mean() - table.values[:, second].mean()), DECIMALS)
    spread = np.std(boot[:, first] - boot[:, second], ddof=1) if len(boot) > 1 else 0.0
    if spread > 0:
        return float(2 * norm.sf(abs(point) / spread))
    per_record = pd.Series(table.values[:, first] - table.values[:, second]).groupby(table.records).mean()
    above, below = int((per_record > 0).sum()), int((per_record < 0).sum())
    return 1.0 if above + below == 0 else float(binomtest(above, above + below, 0.5).pvalue)


def separated(table: Scores, boot: np.ndarray, columns: Sequence[int], level: float = LEVEL) -> np.ndarray:
    """(len(columns), len(columns)) booleans: whether the paired test separates the two columns at `level`, Holm-
    corrected over all pairs of `columns` (symmetric, False on the diagonal)."""
    pairs = [(i, j) for i in range(len(columns)) for j in range(i + 1, len(columns))]
    out = np.zeros((len(columns), len(columns)), dtype=bool)
    if not pairs:
        return out
    adjusted = holm(np.array([pair_pvalue(table, boot, columns[i], columns[j]) for i, j in pairs]))
    for (i, j), p in zip(pairs, adjusted):
        out[i, j] = out[j, i] = p < 1 - level
    return out


def tiers(separation: np.ndarray) -> list[int]:
    """Per cell in rank order, its tier (from 1): a new tier begins between two neighbours only where every cell
    above is separated from every cell below (`separation` in the same order)."""
    out = [1] if len(separation) else []
    for k in range(1, len(separation)):
        out.append(out[-1] + int(separation[:k, k:].all()))
    return out
