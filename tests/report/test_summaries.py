"""Headline numbers, the compare table and the approx/theorems summaries, against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from report_helpers import ANALYZE_N as N
from report_helpers import BUDGETS, METHODS, expected_errors

from spectra.report.summaries import (
    approx_by_budget,
    compare,
    compare_wide,
    head_mean,
    headline,
    interval_digits,
    layer_trend,
    metric_grid,
    per_layer,
    theorem1_draws,
    theorem_errors,
)


def test_stored_c_at_is_the_mean_curve_at_that_index(runs) -> None:
    run = runs["small-wiki"]
    assert run.at == N // 4
    stored = run.metrics.sort_values(["layer", "head"])["c_at_mean"].to_numpy().reshape(run.layers, run.heads)
    np.testing.assert_allclose(stored, run.cum_mean[:, :, run.at - 1], rtol=1e-6)


def test_headline_and_layer_trend(runs) -> None:
    run = runs["deep-wiki"]
    numbers = headline(run)
    grid = run.metrics.pivot(index="layer", columns="head", values="c_at_mean").to_numpy()
    assert (numbers["c_min"], numbers["c_max"]) == (grid.min(), grid.max()) and numbers["at"] == run.n // 4
    means = pd.Series(grid.mean(axis=1))
    ranks = means.rank().to_numpy()
    rho = np.corrcoef(np.arange(len(ranks)), ranks)[0, 1]  # Spearman = Pearson of ranks
    assert numbers["layer_rho"] == pytest.approx(rho)
    assert math.isnan(layer_trend(np.ones((3, 2))))


def test_a_run_of_some_layers_and_heads_summarizes_what_it_measured(runs) -> None:
    """--layers/--heads runs keep only those rows: grids hold NaN elsewhere and per-layer means skip them."""
    run = runs["deep-wiki"]
    full = metric_grid(run, "rank90_mean")
    kept = run.metrics[(run.metrics["layer"] != 1) & (run.metrics["head"] % 2 == 0)].reset_index(drop=True)
    part = type(run)(**{**vars(run), "metrics": kept})
    grid = metric_grid(part, "rank90_mean")
    assert np.isnan(grid[1]).all() and np.isnan(grid[:, 1::2]).all()
    assert np.array_equal(grid[0, ::2], full[0, ::2])
    layers = per_layer(part)
    assert math.isnan(layers["rank90"][1])
    assert layers["rank90"][0] == pytest.approx(full[0, ::2].mean())
    assert np.array_equal(head_mean(full), full.mean(axis=1))
    assert headline(part)["c_max"] == pytest.approx(np.nanmax(metric_grid(part, "c_at_mean")))


def test_compare_table_side_by_side(runs) -> None:
    chosen = [runs["small-wiki"], runs["small-imdb-n16"], runs["deep-imdb"]]
    table = compare(chosen)
    assert list(table.columns) == ["run", "n", "at", "layer", "c_at", "rank90", "rank99"]
    for run in chosen:
        rows = table[table["run"] == run.label]
        per_layer = run.metrics.groupby("layer")[["c_at_mean", "rank90_mean", "rank99_mean"]].mean()
        np.testing.assert_array_equal(rows["layer"], np.arange(run.layers))
        np.testing.assert_allclose(rows["c_at"].to_numpy(), per_layer["c_at_mean"].to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(rows["rank90"].to_numpy(), per_layer["rank90_mean"].to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(rows["rank99"].to_numpy(), per_layer["rank99_mean"].to_numpy(), rtol=1e-12)
        assert set(rows["at"]) == {run.n // 4} and set(rows["n"]) == {run.n}
    # the same model and dataset at two lengths: the names carry n
    lengths = compare([runs["small-imdb"], runs["small-imdb-n16"]])
    assert list(dict.fromkeys(lengths["run"])) == ["roberta-small · imdb n=32", "roberta-small · imdb n=16"]
    wide = compare_wide(table)
    assert list(wide.columns) == ["layer", "A c@8", "A rank90", "B c@4", "B rank90", "C c@8", "C rank90"]
    assert list(wide["layer"]) == [0, 1, 2] and wide["A c@8"].notna().sum() == 2  # 2 layers, then empty
    np.testing.assert_allclose(wide["C rank90"], table[table["run"] == chosen[2].label]["rank90"])
    explicit = compare(chosen[:1], at=3)
    np.testing.assert_allclose(explicit["c_at"], chosen[0].cum_mean[:, :, 2].mean(axis=1))


def test_approx_by_budget_is_the_mean_over_layers_and_heads(approx_run) -> None:
    table = approx_by_budget(approx_run)
    assert list(table.columns) == ["method", "budget", "out_err"]
    assert list(dict.fromkeys(table["method"])) == METHODS  # the run's method order
    out_err = approx_run.head_stats[approx_run.head_stats["metric"] == "out_err"]
    overall = out_err.groupby(["method", "budget"])["mean"].mean()  # equal heads per layer: mean of layer means
    for method in METHODS:
        rows = table[table["method"] == method].sort_values("budget")
        assert list(rows["budget"]) == BUDGETS
        np.testing.assert_allclose(rows["out_err"], overall.loc[method].loc[BUDGETS].to_numpy(), rtol=1e-12)


def test_theorem1_draws_counts_the_independent_rs(theorem_run) -> None:
    """The tiny theorems run draws one R per (layer, budget, sequence): 2 layers × 2 sequences × 1 draw; with a
    fixed projection one R per layer."""
    import copy

    assert theorem_run.meta["model"]["layers"] == 2 and theorem_run.meta["samples"] == 2
    assert theorem1_draws(theorem_run) == (4, "2 layers × 2 sequences × 1 per sequence")
    fixed = copy.copy(theorem_run)
    fixed.tables = {**theorem_run.tables, "theorem1": theorem_run.tables["theorem1"].assign(draws=0)}
    assert theorem1_draws(fixed) == (2, "one R per layer: 2 layers")


def test_theorem_errors_are_the_pooled_rows(theorem_run) -> None:
    table = theorem_errors(theorem_run)
    expected = expected_errors(theorem_run)
    assert list(dict.fromkeys(table["label"])) == list(expected)
    for label, rows in expected.items():
        found = table[table["label"] == label].sort_values("budget")
        assert list(found["budget"]) == BUDGETS
        for stat in ("median", "p95", "mean", "max"):
            np.testing.assert_array_equal(found[stat].to_numpy(), rows[stat].to_numpy())
    # relative to Theorem 2's right side: only the theorem2 rows change
    rhs = theorem_errors(theorem_run, "rhs")
    two = theorem_run.tables["theorem2"]
    for rule in ("1/2^n", "1/n"):
        stored = two[(two["variant"] == f"delta={rule}") & (two["relative_to"] == "rhs")].drop_duplicates("budget")
        found = rhs[rhs["label"] == f"theorem2(delta={rule})"]
        np.testing.assert_array_equal(found.sort_values("budget")["median"].to_numpy(),
                                      stored.sort_values("budget")["median"].to_numpy())
    same = rhs[~rhs["label"].str.startswith("theorem2(")].reset_index(drop=True)
    pd.testing.assert_frame_equal(same, table[~table["label"].str.startswith("theorem2(")].reset_index(drop=True))


def test_growth_reading_says_which_regime_the_exponent_is_in() -> None:
    from spectra.report.summaries import growth_reading

    assert "does not measurably grow" in growth_reading(0.02, -0.05, 0.09)
    assert "slower than n" in growth_reading(0.5, 0.45, 0.55)
    assert "in proportion to n" in growth_reading(0.96, 0.95, 0.97)
    undetermined = growth_reading(0.85, 0.8, 0.95)
    assert "undetermined" in undetermined and "in proportion to n" in undetermined and "slower than n" in undetermined
    assert ": the needed k" not in undetermined, "an interval reaching 0.9 from below is neither reading alone"
    wide = growth_reading(1.00, 0.27, 1.74)  # issue 33: --lengths 64,128 on 2 sequences
    assert wide.startswith("α = 1.00 (95% interval 0.27–1.74): undetermined: the interval holds both")
    assert "grows in proportion to n:" not in wide
    assert "from no growth to growth in proportion to n" in growth_reading(0.4, -0.3, 1.2)
    assert "undetermined" in growth_reading(0.05, -0.05, 0.2), "reaching 0.2 is not 'does not measurably grow'"
    assert growth_reading(0.5, float("nan"), float("nan")).startswith("α = 0.50: ")
    assert "no exponent" in growth_reading(float("nan"), float("nan"), float("nan"))
    assert growth_reading(0.5, 0.42, 0.61).startswith("α = 0.50 (95% interval 0.42–0.61): ")
    assert growth_reading(0.98, 0.9781, 0.9849).startswith("α = 0.98 (95% interval 0.978–0.985): "), "never 0.98–0.98"


def test_scaling_layers_is_the_table_beside_its_fits(scaling_run) -> None:
    from spectra.report.summaries import scaling_layers

    wide = scaling_layers(scaling_run, "rank99")
    assert list(wide["layer"]) == [0, 1, "all"]
    table = scaling_run.table
    assert np.allclose(wide.loc[2, ["n=16", "n=40", "n=64"]].to_numpy(float), table.groupby("n")["rank99"].mean())
    fit = scaling_run.exponents.query("metric == 'rank99' and scope == 'layer' and layer == 1").iloc[0]
    assert wide.loc[1, "α"] == fit["alpha"]


def test_an_empty_fits_better_says_why(scaling_run) -> None:
    """"fits better" names the model with the smaller error; where neither wins it says why: a tie where both fit
    every length exactly (always so with two lengths), n/a where the fit is undefined (a rank of 0)."""
    from spectra.report.summaries import fits_better

    assert fits_better(pd.Series({"better": "log", "rmse_power": 0.2, "rmse_log": 0.1, "lengths": 3})) == "log"
    assert fits_better(pd.Series({"better": "", "rmse_power": 0.0, "rmse_log": 0.0, "lengths": 2})) == "tie"
    assert fits_better(pd.Series({"better": "", "rmse_power": np.nan, "rmse_log": np.nan, "lengths": 3})) == "n/a"


def test_interval_ends_take_the_digits_that_tell_them_apart_and_no_more() -> None:
    """A narrow interval gains decimals until its ends differ; ends that are equal (a degenerate bootstrap: every
    example scored alike) stay at two, since no number of decimals would tell them apart."""
    assert interval_digits(0.5, 0.75) == ("0.50", "0.75")
    assert interval_digits(0.981, 0.984) == ("0.981", "0.984")
    assert interval_digits(0.98101, 0.98102, most=4) == ("0.9810", "0.9810")
    assert interval_digits(0.0, 0.0) == ("0.00", "0.00") and interval_digits(1.0, 1.0) == ("1.00", "1.00")
