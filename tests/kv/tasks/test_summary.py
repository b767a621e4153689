"""Per-task means and their bootstrap intervals against a plain resampling loop written here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectra.seeds import Domain, derive_seed
from spectra.kv.tasks.summary import interval, poisson_weights, task_scores


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
