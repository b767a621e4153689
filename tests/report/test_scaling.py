"""Views of scaling runs: every plotted value is the run's table recomputed here with pandas, the references
pass through the pooled value at the shortest n, and the k = n/4 panel is the table's c_quarter."""

from __future__ import annotations

import numpy as np
import pytest
from report_helpers import by_gid, fake_save, visible_tick_labels

import spectra
from spectra.errors import SpectraError
from spectra.report import scaling as report


def test_rank_view_draws_the_table_and_the_references(scaling_run) -> None:
    table = scaling_run.table
    figure = report.draw_scaling_ranks(scaling_run)
    (ax,) = figure.axes
    for layer in (0, 1):
        line = by_gid(ax.lines, f"layer:{layer}")
        np.testing.assert_array_equal(line.get_xdata(), [16, 40, 64])
        np.testing.assert_allclose(line.get_ydata(), table[table["layer"] == layer].groupby("n")["rank90"].mean(),
                                   rtol=1e-12)
    pooled = table.groupby("n")["rank90"].mean().to_numpy()
    np.testing.assert_allclose(by_gid(ax.lines, "pooled").get_ydata(), pooled, rtol=1e-12)
    n = np.array([16, 40, 64])
    np.testing.assert_allclose(by_gid(ax.lines, "ref:const").get_ydata(), pooled[0])
    np.testing.assert_allclose(by_gid(ax.lines, "ref:∝ log n").get_ydata(), pooled[0] * np.log(n) / np.log(16))
    np.testing.assert_allclose(by_gid(ax.lines, "ref:∝ n").get_ydata(), pooled[0] * n / 16)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    alpha = scaling_run.exponents.query("metric == 'rank90' and scope == 'pooled' and method == ''")["alpha"].iloc[0]
    assert f"α = {alpha:.2f}" in by_gid(ax.lines, "pooled").get_label()


def test_rank_axis_labels_are_plain_numbers(scaling_run) -> None:
    """The log rank axis reads 20, 30, 50, not 2×10¹, 3×10¹, 5×10¹, and labels at least two ticks; the legend is
    beside the axes, not over the reference lines."""
    figure = report.draw_scaling_ranks(scaling_run)
    (ax,) = figure.axes
    figure.canvas.draw()
    low, high = ax.get_ylim()
    labels = visible_tick_labels(ax.yaxis, low, high)
    assert len(labels) >= 2, labels
    for value, text in labels.items():
        assert float(text) == pytest.approx(value), (value, text)
    assert not ax.get_legend().get_window_extent().overlaps(ax.get_window_extent()), "the legend covers no line"


def test_c_view_draws_fixed_budgets_and_the_quarter(scaling_run) -> None:
    figure = report.draw_scaling_c(scaling_run)
    lines = [line for ax in figure.axes for line in ax.lines]
    fixed = scaling_run.c_fixed
    line = by_gid(lines, "c:32:pooled")
    np.testing.assert_array_equal(line.get_xdata(), [40, 64])
    np.testing.assert_allclose(line.get_ydata(), fixed[fixed["budget"] == 32].groupby("n")["c"].mean(), rtol=1e-12)
    quarter = by_gid(lines, "c:n/4:layer:1")
    table = scaling_run.table
    np.testing.assert_allclose(quarter.get_ydata(), table[table["layer"] == 1].groupby("n")["c_quarter"].mean())
    assert not [line for line in lines if str(line.get_gid()).startswith("c:64")], "k = 64 is below n at one n only"


def test_plot_scaling_writes_both_views_and_refuses_other_runs(scaling_run, runs, monkeypatch, tmp_path) -> None:
    saved = fake_save(monkeypatch)
    paths = report.plot_scaling(scaling_run, tmp_path / "views")
    assert [path.name for path in paths] == ["rank_vs_n.png", "rank_vs_n.pdf", "c_fixed_vs_n.png", "c_fixed_vs_n.pdf"]
    assert len(saved) == 2
    with pytest.raises(SpectraError, match="holds a run of 'spectra analyze'; this needs a run of 'spectra scaling'"):
        spectra.load_run(runs["small-wiki"].path, "scaling")
