"""Streaming statistics against numpy, independent of batching, and their states (checkpoint arrays and reductions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.stats import ErrorStats, Moments, Reduce, Tagged, plain, tagged


def test_error_stats_against_numpy_and_batching() -> None:
    generator = np.random.default_rng(0)
    samples = np.exp(generator.normal(-2.0, 1.5, size=(2, 3, 20000)))
    samples[0, 0, :5] = 0.0  # exact zeros go to the underflow bin
    samples[1, 2, :50] = 1e5  # beyond the overflow edge
    whole = ErrorStats((2, 3), [0.01, 0.1, 0.5])
    whole.add((), torch.from_numpy(samples))
    pieces = ErrorStats((2, 3), [0.01, 0.1, 0.5])
    for chunk in np.array_split(samples, 7, axis=-1):
        for row in range(2):
            pieces.add(row, torch.from_numpy(chunk[row]))
    for name in ("count", "below", "hist"):
        assert np.array_equal(getattr(whole, name), getattr(pieces, name))
    assert np.allclose(whole.total, pieces.total) and np.array_equal(whole.max, pieces.max)
    assert np.array_equal(whole.below, (samples[..., None] <= np.array([0.01, 0.1, 0.5])).sum(-2))
    coarse = ErrorStats((2, 3), [0.5], per_decade=10)  # 26% wide bins: interpolation inside a bin matters
    coarse.add((), torch.from_numpy(samples))
    for q in (0.5, 0.95):
        want = np.quantile(samples, q, axis=-1)
        assert np.allclose(whole.quantile(q), want, rtol=0.025)
        assert np.allclose(coarse.quantile(q), want, rtol=0.015)
    frame = whole.frame({"a": [0, 1], "b": ["x", "y", "z"]})
    assert len(frame) == 2 * 3 * 3
    row = frame[(frame["a"] == 1) & (frame["b"] == "z") & (frame["eps"] == 0.1)].iloc[0]
    assert row["pr"] == pytest.approx((samples[1, 2] <= 0.1).mean())
    assert row["mean"] == pytest.approx(samples[1, 2].mean()) and row["max"] == 1e5
    restored = ErrorStats((2, 3), [0.01, 0.1, 0.5])
    restored.load_state(plain(whole.state("x")), "x")
    assert restored.frame({"a": [0, 1], "b": ["x", "y", "z"]}).equals(frame)
    keep = torch.zeros(2, 3, 20000, dtype=torch.bool)
    keep[..., :100] = True
    kept = ErrorStats((2, 3), [0.5])
    kept.add((), torch.from_numpy(samples), keep)
    assert (kept.count == 100).all()
    assert np.allclose(kept.total, samples[..., :100].sum(-1))


def test_error_stats_pooled_equals_adding_everything_into_one_cell() -> None:
    samples = np.exp(np.random.default_rng(1).normal(-1.0, 1.0, size=(2, 3, 500)))
    cells = ErrorStats((2, 3), [0.1, 0.5])
    cells.add((), torch.from_numpy(samples))
    one = ErrorStats((1,), [0.1, 0.5])
    one.add((), torch.from_numpy(samples.reshape(1, -1)))
    pooled = cells.pooled((0, 1))
    for name in ("count", "below", "hist", "min", "max"):
        assert np.array_equal(getattr(pooled, name), getattr(one, name)[0]), name
    assert np.allclose(pooled.total, one.total[0])


def test_nan_errors_count_as_failures() -> None:
    stats = ErrorStats((1,), [0.5])
    stats.add((), torch.tensor([[0.1, float("nan"), 0.2]]))
    assert stats.count[0] == 3 and stats.below[0, 0] == 2 and stats.max[0] == np.inf


def test_moments_match_numpy_mean_and_std() -> None:
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(37, 3, 5))
    moments = Moments.zeros((2, 3, 5))
    for chunk in np.array_split(samples, 4):
        moments.add(1, torch.from_numpy(chunk))
    assert np.allclose(moments.mean[1], samples.mean(0), atol=1e-12)
    assert np.allclose(moments.std[1], samples.std(0), atol=1e-12)
    assert (moments.count[1] == 37).all() and (moments.count[0] == 0).all()
    restored = Moments.from_arrays(plain(moments.state("m")), "m")
    assert np.array_equal(restored.mean, moments.mean) and np.array_equal(restored.std, moments.std)


def test_state_tags_min_and_max_and_sums_the_rest() -> None:
    stats = ErrorStats((2,), [0.5])
    stats.add((), torch.rand(2, 10, dtype=torch.float64))
    state = stats.state("theorem1")
    assert set(state) == {f"theorem1.{name}" for name in ("count", "below", "hist", "total", "total_sq", "min", "max")}
    assert all(isinstance(part, Tagged) for part in state.values())
    assert state["theorem1.min"].reduce is Reduce.MIN
    assert state["theorem1.max"].reduce is Reduce.MAX
    for name in ("count", "below", "hist", "total", "total_sq"):
        assert state[f"theorem1.{name}"].reduce is Reduce.SUM, name
    assert state["theorem1.min"].array is stats.min
    moments = Moments.zeros((2, 3))
    assert {name: part.reduce for name, part in moments.state("cum").items()} == {
        "cum.count": Reduce.SUM, "cum.total": Reduce.SUM, "cum.total_sq": Reduce.SUM}
    assert plain(state)["theorem1.max"] is stats.max
    assert tagged({"d": [3]}, Reduce.MAX)["d"].reduce is Reduce.MAX and tagged({"d": [3]})["d"].reduce is Reduce.SUM


def test_wilson_interval_contains_its_estimate_for_every_count() -> None:
    """Every count and every number of successes: the interval holds the estimate, its ends are exactly 0 at
    Pr = 0 and exactly 1 at Pr = 1 (rounding once left 5.5e-17 and 0.9999999999999999), and it is scipy's."""
    from scipy.stats import binomtest

    from spectra.stats import wilson

    for count in range(1, 121):
        successes = np.arange(count + 1)
        p = successes / count
        low, high = wilson(p, np.full(count + 1, count))
        assert np.all(low <= p) and np.all(p <= high), count
        assert low[0] == 0.0 and high[-1] == 1.0 and np.all(low >= 0) and np.all(high <= 1)
        for k in {0, 1, count // 2, count - 1, count}:
            reference = binomtest(int(k), count).proportion_ci(confidence_level=0.95, method="wilson")
            assert (low[k], high[k]) == pytest.approx((reference.low, reference.high), abs=1e-12)


def test_clopper_pearson_is_scipys_exact_binomial_interval() -> None:
    from scipy.stats import binomtest

    from spectra.stats import clopper_pearson

    for successes, count in ((0, 1), (0, 50), (1, 50), (17, 50), (49, 50), (50, 50), (110, 110), (3, 227)):
        low, high = clopper_pearson(successes, count)
        exact = binomtest(successes, count).proportion_ci(0.95, method="exact")
        assert (float(low), float(high)) == pytest.approx((exact.low, exact.high), rel=1e-9, abs=1e-15)
    low, high = clopper_pearson(np.array([0, 250]), np.array([250, 250]))
    assert low.tolist()[0] == 0.0 and high.tolist()[1] == 1.0
    assert high[0] == pytest.approx(1 - 0.025 ** (1 / 250)) and low[1] == pytest.approx(0.025 ** (1 / 250))
    assert clopper_pearson(0, 250, level=0.9)[1] == pytest.approx(1 - 0.05 ** (1 / 250))
