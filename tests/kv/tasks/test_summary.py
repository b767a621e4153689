"""Per-task means and their bootstrap intervals against a plain resampling loop written here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectra.seeds import Domain, derive_seed
from spectra.kv.tasks.summary import interval, poisson_weights, question_drop, task_scores


def examples_table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for example in range(12):
        task = "passkey" if example < 7 else "vt"
        rows.append({"press": "full", "ratio": 0.0, "example": example, "task": task, "score": 1.0})
        for ratio in (0.5, 0.75):
            rows.append({"press": "knorm", "ratio": ratio, "example": example, "task": task,
                         "score": float(rng.integers(0, 2))})
    return pd.DataFrame(rows)


def test_weights_are_fixed_by_the_example_index() -> None:
    weights = poisson_weights([3, 8], seed=5, replicates=50)
    for column, example in enumerate((3, 8)):
        want = np.random.default_rng(derive_seed(5, Domain.BOOTSTRAP, example)).poisson(1.0, 50)
        np.testing.assert_array_equal(weights[:, column], want)
    np.testing.assert_array_equal(poisson_weights([8], seed=5, replicates=50)[:, 0], weights[:, 1])


def test_task_means_and_intervals_equal_a_plain_loop() -> None:
    table = examples_table()
    found = task_scores(table, seed=1, replicates=300)
    assert len(found) == 6 and set(found["press"]) == {"full", "knorm"}
    for _, row in found.iterrows():
        chosen = table[(table["press"] == row["press"]) & (table["ratio"] == row["ratio"])
                       & (table["task"] == row["task"])].sort_values("example")
        scores = chosen["score"].to_numpy()
        assert row["score"] == pytest.approx(scores.mean()) and row["examples"] == len(scores)
        assert row["full"] == 1.0 and row["delta"] == pytest.approx(scores.mean() - 1.0)
        means = []
        for r in range(300):
            w = np.array([np.random.default_rng(derive_seed(1, Domain.BOOTSTRAP, int(e))).poisson(1.0, 300)[r]
                          for e in chosen["example"]], dtype=float)
            if w.sum() > 0:
                means.append((w * scores).sum() / w.sum())
        assert row["low"] == pytest.approx(np.quantile(means, 0.025))
        assert row["high"] == pytest.approx(np.quantile(means, 0.975))
        assert row["delta_low"] == pytest.approx(row["low"] - 1.0)
        assert row["delta_high"] == pytest.approx(row["high"] - 1.0)
    by_length = task_scores(table.assign(length=1024), seed=1, by=("task", "length"), replicates=50)
    assert list(by_length.columns[:4]) == ["press", "ratio", "task", "length"]


def test_an_interval_without_weight_is_nan() -> None:
    assert np.isnan(interval(np.array([1.0]), np.zeros((4, 1)))).all()


def questions_table(shift: int) -> pd.DataFrame:
    """Records of three questions each: press knorm's scores drawn, the full cache's all 1."""
    rng = np.random.default_rng(shift)
    rows = []
    for example in range(6):
        for question in range(3):
            rows.append({"press": "full", "ratio": 0.0, "example": example, "question": question, "task": "kv",
                         "score": 1.0})
            rows.append({"press": "knorm", "ratio": 0.5, "example": example, "question": question, "task": "kv",
                         "score": float(rng.integers(0, 2))})
    return pd.DataFrame(rows)


def test_questions_pair_with_the_full_cache_on_the_same_question_and_share_their_record_weight() -> None:
    table = questions_table(0)
    found = task_scores(table, seed=2, by=("task", "question"), replicates=200).set_index(["press", "question"])
    for question in range(3):
        mine = table[(table["press"] == "knorm") & (table["question"] == question)].sort_values("example")
        row = found.loc[("knorm", question)]
        assert row["score"] == pytest.approx(mine["score"].mean()) and row["full"] == 1.0 and row["examples"] == 6
    records = task_scores(table, seed=2, replicates=200).set_index("press").loc["knorm"]
    scores = table[table["press"] == "knorm"].sort_values(["example", "question"])["score"].to_numpy()
    weights = np.repeat(poisson_weights(range(6), seed=2, replicates=200), 3, axis=1)  # a record's three questions
    used = weights.sum(axis=1) > 0
    means = weights[used] @ scores / weights[used].sum(axis=1)
    assert records["score"] == pytest.approx(scores.mean())
    assert (records["low"], records["high"]) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))


def test_the_question_drop_is_the_paired_difference_of_two_runs() -> None:
    in_view, once = questions_table(1), questions_table(2)
    found = question_drop(in_view, once, seed=3, replicates=200).set_index("press")
    row = found.loc["knorm"]
    keys = ["example", "question"]
    mine = in_view[in_view["press"] == "knorm"].sort_values(keys)["score"].to_numpy()
    theirs = once[once["press"] == "knorm"].sort_values(keys)["score"].to_numpy()
    assert (row["in_view"], row["once"]) == pytest.approx((mine.mean(), theirs.mean())) and row["questions"] == 18
    assert row["drop"] == pytest.approx(mine.mean() - theirs.mean()) and row["drop"] != 0
    weights = np.repeat(poisson_weights(range(6), seed=3, replicates=200), 3, axis=1)
    used = weights.sum(axis=1) > 0
    means = weights[used] @ (mine - theirs) / weights[used].sum(axis=1)
    assert (row["drop_low"], row["drop_high"]) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert found.loc["full", "drop"] == 0
