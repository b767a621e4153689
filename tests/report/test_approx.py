"""Views of approx runs: files are written, and every plotted value is the run's stored value (recomputed here
with pandas from the tables), and the CLI's --plot renders them."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from report_helpers import APPROX_N as N
from report_helpers import (
    BUDGETS,
    METHODS,
    by_gid,
    check_below_marks,
    fake_save,
    legend_texts,
)

from spectra import cli
from spectra.api import approx
from spectra.errors import SpectraError
from spectra.report import approx as report


def test_approx_views_plot_the_stored_values(approx_run) -> None:
    out_err = approx_run.head_stats[approx_run.head_stats["metric"] == "out_err"]
    per_layer = out_err.groupby(["method", "budget", "layer"])["mean"].mean()
    target = approx_run.meta["target"]

    figure = report.draw_approx_layers(approx_run)
    for budget in BUDGETS:
        ax = by_gid(figure.axes, f"layers:k={budget}")
        assert ax.get_yscale() == "log" and ax.get_title() == f"k = {budget}"
        for method in METHODS:
            line = by_gid(ax.lines, method)
            expected = per_layer.loc[(method, budget)].sort_index()
            np.testing.assert_array_equal(line.get_xdata(), expected.index.to_numpy())
            np.testing.assert_allclose(line.get_ydata(), expected.to_numpy(), rtol=1e-12)
        assert list(by_gid(ax.lines, "target").get_ydata()) == [target, target]
        check_below_marks(ax, METHODS)
    exact = by_gid(figure.axes, f"layers:k={N}")
    assert by_gid(exact.lines, "below:pool-mean")  # pooling at k = n is exact: 0 on a log axis
    assert legend_texts(figure)[:len(METHODS)] == METHODS and "below the axis (≈ 0: exact)" in legend_texts(figure)

    figure = report.draw_approx_budgets(approx_run)
    ax = by_gid(figure.axes, "budgets")
    overall = out_err.groupby(["method", "budget"])["mean"].mean()  # equal heads per layer: mean of layer means
    for method in METHODS:
        line = by_gid(ax.lines, method)
        np.testing.assert_array_equal(line.get_xdata(), BUDGETS)
        np.testing.assert_allclose(line.get_ydata(), overall.loc[method].loc[BUDGETS].to_numpy(), rtol=1e-12)
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    assert list(ax.get_xticks()) == BUDGETS and list(by_gid(ax.lines, "target").get_ydata()) == [target, target]
    assert legend_texts(figure)[:len(METHODS)] == METHODS


def test_end_to_end_view_perplexity_and_drift(approx_run) -> None:
    table = approx_run.end_to_end
    figure = report.draw_end_to_end(approx_run)
    ppl, drift = by_gid(figure.axes, "ppl"), by_gid(figure.axes, "hidden_rel_err")
    for method in METHODS:
        rows = table[table["method"] == method].sort_values("budget")
        for ax, column in ((ppl, "ppl"), (drift, "hidden_rel_err")):
            line = by_gid(ax.lines, method)
            np.testing.assert_array_equal(line.get_xdata(), BUDGETS)
            np.testing.assert_allclose(line.get_ydata(), rows[column].to_numpy(), rtol=1e-12)
    exact = table["ppl_exact"].unique()
    assert len(exact) == 1 and list(by_gid(ppl.lines, "exact").get_ydata()) == [exact[0]] * 2
    assert any(text.startswith("exact model") for text in legend_texts(figure))

    # without an MLM head: the drift alone
    drift_only = table.drop(columns=["masked_tokens", "loss_exact", "loss", "ppl_exact", "ppl", "ppl_change"])
    figure = report.draw_end_to_end(dataclasses.replace(approx_run, end_to_end=drift_only))
    assert [ax.get_gid() for ax in figure.axes] == ["hidden_rel_err"]


def test_plot_approx_figures_and_folders(approx_run, tmp_path, monkeypatch) -> None:
    names = fake_save(monkeypatch)
    paths = report.plot_approx(approx_run, tmp_path / "views")
    assert names == [str(tmp_path / "views" / name) for name in ("error_vs_layer", "error_vs_k", "end_to_end")]
    assert len(paths) == 6
    names.clear()
    report.plot_approx(dataclasses.replace(approx_run, end_to_end=None))  # without --end-to-end: two figures
    assert names == [str(approx_run.path / "figures" / name) for name in ("error_vs_layer", "error_vs_k")]
    (tmp_path / "file").write_text("")
    with pytest.raises(SpectraError, match="not a directory"):
        report.plot_approx(approx_run, tmp_path / "file")


def wrote(stdout: str) -> list[str]:
    return [line.removeprefix("wrote ") for line in stdout.splitlines() if line.startswith("wrote ")]


def test_cli_approx_plot_flag(approx_run, tmp_path, monkeypatch, capsys) -> None:
    """`spectra approx RUN --plot` renders real files into RUN/figures, never into the current directory (a
    clone's tracked figures/ folder)."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "approx", str(approx_run.path), "--plot"])
    cli.main()
    names = ["error_vs_layer", "error_vs_k", "end_to_end"]
    expected = [f"{approx_run.path}/figures/{name}.{fmt}" for name in names for fmt in ("png", "pdf")]
    assert wrote(capsys.readouterr().out) == expected and list(tmp_path.iterdir()) == []
    for path in expected[::2]:
        with Image.open(path) as image:
            assert image.info["dpi"][0] == pytest.approx(200, abs=1) and image.size[0] > 1000
    assert all(Path(path).read_bytes().startswith(b"%PDF") for path in expected[1::2])


def test_a_k_plan_is_drawn_against_the_uniform_k(roberta_dir, text_file, tmp_path, monkeypatch) -> None:
    """The plan view holds each layer's error at its planned k (dashed) and at the uniform k (solid), the
    planned k on the top axis; end to end puts the two allocations side by side."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"layers": [{"layer": 0, "budget": 4}, {"layer": 1, "budget": 12}]}))
    run = approx(str(roberta_dir), str(text_file), methods=["svd", "pool-mean"], k_plan=plan, length=N, samples=4,
                 batch_size=4, end_to_end=True, out=tmp_path / "planned", progress=None, notify=lambda line: None)
    figure = report.draw_plan_layers(run)
    ax = by_gid(figure.axes, "plan")
    for table, name in ((run.plan, "plan"), (run.head_stats, "uniform")):
        out_err = table[table["metric"] == "out_err"].groupby(["method", "layer"])["mean"].mean()
        for method in ("svd", "pool-mean"):
            line = by_gid(ax.lines, f"{name}:{method}")
            assert line.get_linestyle() == ("--" if name == "plan" else "-")
            np.testing.assert_array_equal(line.get_xdata(), [0, 1])
            np.testing.assert_allclose(line.get_ydata(), out_err.loc[method].sort_index().to_numpy(), rtol=1e-12)
    top = [axis for axis in ax.child_axes if axis.get_xlabel() == "planned k"]
    assert len(top) == 1 and [t.get_text() for t in top[0].get_xticklabels()] == ["4", "12"]

    figure = report.draw_end_to_end(run)
    for gid in ("ppl", "hidden_rel_err"):
        panel = by_gid(figure.axes, gid)
        assert [t.get_text() for t in panel.get_xticklabels()] == ["uniform k = 8", "k plan (mean 8)"]
        for method in ("svd", "pool-mean"):
            rows = run.end_to_end[run.end_to_end["method"] == method].set_index("allocation")
            np.testing.assert_allclose(by_gid(panel.lines, method).get_ydata(),
                                       rows.loc[["uniform", "plan"], gid].to_numpy(), rtol=1e-12)
    names = fake_save(monkeypatch)
    report.plot_approx(run, tmp_path / "views")
    assert [Path(name).name for name in names] == ["error_vs_layer", "error_vs_k", "plan_vs_uniform", "end_to_end"]
