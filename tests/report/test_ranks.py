"""The leaderboard's statistics against independent computations: the stratified paired bootstrap against a loop over
replicates and examples, rank intervals against sorted ranks, Holm against a hand computation, the pair test against
scipy's normal and binomial distributions, Clopper–Pearson against scipy's exact binomial interval."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest, norm

from spectra.report import ranks
from spectra.seeds import Domain, derive_seed

SEED, REPLICATES = 11, 400


def table(columns: dict[str, list[float]], tasks: list[str], records: list[int] | None = None) -> ranks.Scores:
    """A units × cells table: `columns` name → per-unit scores, each unit's task, and its record (default: its own)."""
    records = list(range(len(tasks))) if records is None else records
    rows = [{"press": name, "example": record, "question": unit, "task": task, "score": float(value),
             "bytes_share": 0.5} for name, values in columns.items()
            for unit, (record, task, value) in enumerate(zip(records, tasks, values))]
    return ranks.scores(pd.DataFrame(rows), ("press",))


def looped_replicates(columns: dict[str, list[float]], tasks: list[str], seed: int, count: int) -> np.ndarray:
    """The stratified Poisson bootstrap written as loops: per example its own generator's draws, per replicate and
    task the weighted mean, combined by the tasks' shares; a replicate where a task weighs nothing left out."""
    draws = {example: np.random.default_rng(derive_seed(seed, Domain.BOOTSTRAP, example)).poisson(1.0, count)
             for example in range(len(tasks))}
    out = []
    for b in range(count):
        means, usable = [], True
        for name, values in columns.items():
            total = 0.0
            for task in dict.fromkeys(tasks):
                members = [i for i, t in enumerate(tasks) if t == task]
                weight = sum(draws[i][b] for i in members)
                if weight == 0:
                    usable = False
                    break
                total += len(members) / len(tasks) * sum(draws[i][b] * values[i] for i in members) / weight
            means.append(total)
        if usable:
            out.append(means)
    return np.array(out)


COLUMNS = {"full": [1, 1, 1, 1, 1, 0, 1, 1, 1], "a": [1, 0, 1, 1, 0, 0, 1, 1, 0], "b": [0.5, 0, 1, 0.25, 0, 0, 1, 0, 0]}
TASKS = ["x", "x", "x", "y", "y", "z", "z", "z", "z"]


def test_the_stratified_paired_bootstrap_is_the_loop_over_replicates_and_examples() -> None:
    scores = table(COLUMNS, TASKS)
    boot = ranks.replicates(scores, SEED, REPLICATES)
    want = looped_replicates(COLUMNS, TASKS, SEED, REPLICATES)
    assert boot.shape == want.shape and len(want) < REPLICATES  # y's two examples both draw 0 now and then
    np.testing.assert_allclose(boot, want, rtol=0, atol=1e-11)
    assert np.array_equal(boot, ranks.replicates(scores, SEED, REPLICATES)), "bitwise reproducible from the seed"
    # paired: a difference's replicates are the replicates of the per-example differences (the same weights)
    difference = table({"d": [a - f for a, f in zip(COLUMNS["a"], COLUMNS["full"])], "f": COLUMNS["full"]}, TASKS)
    np.testing.assert_allclose(ranks.replicates(difference, SEED, REPLICATES)[:, 0], boot[:, 1] - boot[:, 0],
                               atol=1e-11)


def test_stratification_fixes_the_tasks_mix() -> None:
    """A cell answering every example of one task and none of the other: resampled within each task its mean never
    moves from the task's share; resampled over all examples together it would."""
    scores = table({"full": [1] * 6, "a": [1, 1, 1, 1, 0, 0]}, ["x"] * 4 + ["y"] * 2)
    boot = ranks.replicates(scores, SEED, REPLICATES)
    assert np.all(boot[:, 1] == pytest.approx(4 / 6, abs=1e-12))
    unstratified = table({"full": [1] * 6, "a": [1, 1, 1, 1, 0, 0]}, ["x"] * 6)
    assert ranks.replicates(unstratified, SEED, REPLICATES)[:, 1].std() > 0.1


def test_the_summary_uses_percentiles_and_exact_binomial_bounds_where_every_example_agrees() -> None:
    columns = {"full": [1] * 9, "a": COLUMNS["a"], "zero": [0] * 9, "same": [1] * 9}
    scores = table(columns, TASKS)
    boot = ranks.replicates(scores, SEED, REPLICATES)
    summary = ranks.summary(scores, boot, "full").set_index("cell")
    a = summary.loc["a"]
    assert a["score"] == pytest.approx(np.mean(COLUMNS["a"])) and a["examples"] == 9
    assert (a["low"], a["high"]) == pytest.approx(tuple(np.quantile(boot[:, 1], [0.025, 0.975])))
    assert a["delta"] == pytest.approx(np.mean(COLUMNS["a"]) - 1)
    assert (a["delta_low"], a["delta_high"]) == pytest.approx(tuple(np.quantile(boot[:, 1] - boot[:, 0],
                                                                                [0.025, 0.975])))
    exact = binomtest(0, 9).proportion_ci(0.95, method="exact")
    assert summary.loc["zero", "low"] == 0 and summary.loc["zero", "high"] == pytest.approx(exact.high, rel=1e-9)
    assert summary.loc["zero", "high"] == pytest.approx(1 - 0.025 ** (1 / 9), rel=1e-9)
    assert summary.loc["same", "low"] == pytest.approx(1 - exact.high, rel=1e-9) and summary.loc["same", "high"] == 1
    assert summary.loc["same", "delta"] == 0
    assert (summary.loc["same", "delta_low"], summary.loc["same", "delta_high"]) == pytest.approx(
        (-exact.high, exact.high))
    # a record's questions are not independent trials: 3 records of 3 questions each bound as 3 trials
    grouped = table(columns, TASKS, records=[0, 0, 0, 1, 1, 1, 2, 2, 2])
    clustered = ranks.summary(grouped, ranks.replicates(grouped, SEED, REPLICATES), "full").set_index("cell")
    assert clustered.loc["zero", "high"] == pytest.approx(binomtest(0, 3).proportion_ci(0.95).high, rel=1e-9)


def test_rank_intervals_are_the_quantiles_of_each_replicates_ranks() -> None:
    generator = np.random.default_rng(3)
    boot = np.round(generator.normal([0.5, 0.48, 0.3, 0.3], 0.05, size=(401, 4)), 2)  # rounding makes ties
    boot[:, 3] = boot[:, 2]  # two cells equal in every replicate share their rank
    low, high = ranks.rank_intervals(boot)
    for column in range(4):
        looped = sorted(1 + sum(other > row[column] for other in row) for row in boot)
        assert low[column] == looped[math.ceil(0.025 * len(boot)) - 1]
        assert high[column] == looped[math.ceil(0.975 * len(boot)) - 1]
    assert (low[2], high[2]) == (low[3], high[3]) and low[0] == 1 and high[2] == 3


def test_holm_against_a_hand_computation() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 → running maximum 0.02, 0.03, 0.06, 0.06
    assert ranks.holm(np.array([0.01, 0.04, 0.03, 0.005])) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert ranks.holm(np.array([0.3, 0.6])) == pytest.approx([0.6, 0.6])  # 0.6 and max(0.6, 0.6); clipped at 1:
    assert ranks.holm(np.array([0.5, 0.7, 0.2])) == pytest.approx([1.0, 1.0, 0.6])


def test_the_pair_test_is_a_z_test_on_the_bootstrap_spread_or_the_sign_test_where_there_is_none() -> None:
    scores = table(COLUMNS, TASKS)
    boot = ranks.replicates(scores, SEED, REPLICATES)
    difference = np.array(COLUMNS["a"]).mean() - np.array(COLUMNS["b"]).mean()
    spread = np.std(boot[:, 1] - boot[:, 2], ddof=1)
    assert ranks.pair_pvalue(scores, boot, 1, 2) == pytest.approx(2 * (1 - norm.cdf(abs(difference) / spread)))
    # 6 records, one press answering each and the other none: no spread, the sign test 2 × 0.5⁶
    split = table({"one": [1] * 6, "none": [0] * 6}, ["x"] * 6)
    assert ranks.pair_pvalue(split, ranks.replicates(split, SEED, REPLICATES), 0, 1) == pytest.approx(2 * 0.5 ** 6)
    same = table({"one": COLUMNS["a"], "two": COLUMNS["a"]}, TASKS)
    assert ranks.pair_pvalue(same, ranks.replicates(same, SEED, REPLICATES), 0, 1) == 1.0


def test_tiers_cut_only_where_every_press_above_is_separated_from_every_press_below() -> None:
    every = ~np.eye(4, dtype=bool)
    assert ranks.tiers(every) == [1, 2, 3, 4]
    middle = every.copy()
    middle[1, 2] = middle[2, 1] = False
    assert ranks.tiers(middle) == [1, 2, 2, 3]
    chained = np.zeros((4, 4), dtype=bool)  # only the ends apart: 0 ~ 1 ~ 2 ~ 3, no cut
    for i, j in ((0, 2), (0, 3), (1, 3)):
        chained[i, j] = chained[j, i] = True
    assert ranks.tiers(chained) == [1, 1, 1, 1]
    neighbours = np.array([[False, True, False], [True, False, True], [False, True, False]])
    assert ranks.tiers(neighbours) == [1, 1, 1], "the ends are not separated: no cut, though neighbours are"
    scores = table({"full": [1] * 40, "top": [1] * 38 + [0] * 2, "twin": [1] * 38 + [0] * 2,
                    "low": [1] * 5 + [0] * 35}, ["x"] * 20 + ["y"] * 20)
    boot = ranks.replicates(scores, SEED, REPLICATES)
    apart = ranks.separated(scores, boot, [1, 2, 3])
    assert apart.tolist() == [[False, False, True], [False, False, True], [True, True, False]]
    assert ranks.tiers(apart) == [1, 1, 2]
