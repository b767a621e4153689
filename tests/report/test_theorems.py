"""Views of theorems runs: every plotted value is the run's stored value (recomputed here with pandas from the
tables), the Theorem 1 bound is the formula, and the CLI's --plot and the analyses/theorems.py recipe work on
real tiny runs."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex
from report_helpers import APPROX_N as N
from report_helpers import (
    BUDGETS,
    by_gid,
    check_below_marks,
    expected_errors,
    fake_save,
    legend_texts,
)

import spectra
from spectra import cli
from spectra.api import theorems
from spectra.errors import SpectraError
from spectra.report import theorems as report


Z = 1.959963984540054  # the normal 97.5% quantile


def independent_draws(run) -> int:
    """R is drawn per (layer, budget, sequence, draw): layers × sequences × draws rates are independent."""
    one = run.tables["theorem1"]
    layers = run.tables["theorem1_layers"]["layer"].nunique()
    return layers * int(one["sequences"].iloc[0]) * int(one["draws"].iloc[0])


def wilson_interval(p: float, count: int) -> tuple[float, float]:
    """Wilson's score interval from its formula (Wilson 1927; Agresti & Coull 1998, eq. 2)."""
    centre = (p + Z * Z / (2 * count)) / (1 + Z * Z / count)
    half = Z / (1 + Z * Z / count) * math.sqrt(p * (1 - p) / count + Z * Z / (4 * count * count))
    return max(0.0, centre - half), min(1.0, centre + half)


def check_bars(ax, eps: float, rows, count: int) -> None:
    """The error bars of ε: one vertical segment per budget from Wilson's low to high end at the plotted rate,
    thinner than the rate's line."""
    bars = by_gid(ax.collections, f"pr_interval:{eps:g}")
    segments = sorted(bars.get_segments(), key=lambda segment: segment[0][0])
    assert len(segments) == len(rows)
    for segment, p in zip(segments, rows["pr"]):
        (x0, y0), (x1, y1) = segment
        low, high = wilson_interval(p, count)
        assert x0 == x1
        assert (min(y0, y1), max(y0, y1)) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    assert max(bars.get_linewidths()) < by_gid(ax.lines, f"pr:{eps:g}").get_linewidth()
    assert not [item for item in ax.collections if item.get_gid() != f"pr_interval:{eps:g}"
                and type(item).__name__ in ("PolyCollection", "FillBetweenPolyCollection")], "no shaded band"


def test_theorem1_view_probability_bound_and_k(theorem_run) -> None:
    one = theorem_run.tables["theorem1"]
    jl = one[(one["method"] == "jl") & (one["relative_to"] == "output")]
    entries = one[(one["method"] == "jl") & (one["relative_to"] == "rows")]
    n = int(one["n"].iloc[0])
    figure = report.draw_theorem1(theorem_run)
    ax = by_gid(figure.axes, "theorem1")
    for eps in (0.3, 0.5):
        rows = jl[jl["eps"] == eps].sort_values("budget")
        line = by_gid(ax.lines, f"pr:{eps:g}")
        np.testing.assert_array_equal(line.get_xdata(), BUDGETS)
        np.testing.assert_allclose(line.get_ydata(), rows["pr"].to_numpy(), rtol=1e-12)
        proof = by_gid(ax.lines, f"pr_rows:{eps:g}")
        np.testing.assert_allclose(proof.get_ydata(), entries[entries["eps"] == eps].sort_values("budget")["pr"],
                                   rtol=1e-12)
        check_bars(ax, eps, rows, independent_draws(theorem_run))
        bound = by_gid(ax.lines, f"bound:{eps:g}")
        k = np.asarray(bound.get_xdata(), dtype=float)
        assert len(k) >= 100 and k[0] <= BUDGETS[0] and k[-1] >= BUDGETS[-1]  # a fine grid over the axis
        formula = [max(0.0, 1 - 2 * n * math.exp(-(eps**2 - eps**3) * x / 4)) for x in k]
        np.testing.assert_allclose(bound.get_ydata(), formula, rtol=1e-12, atol=1e-15)
        stored = [max(0.0, 1 - 2 * n * math.exp(-(eps**2 - eps**3) * x / 4)) for x in rows["budget"]]
        np.testing.assert_allclose(rows["bound"], stored, rtol=1e-12, atol=1e-15)
        # k(ε) = 5 ln n/(ε² − ε³) is far right of k ≤ 24: in the legend, not drawn
        k_theory = 5 * math.log(n) / (eps**2 - eps**3)
        assert f"ε = {eps:g}: k(ε) = {k_theory:,.0f}" in legend_texts(figure)
        assert not [item for item in ax.lines if item.get_gid() == f"k_theory:{eps:g}"]
    assert ax.get_xscale() == "log" and ax.get_ylim() == (-0.03, 1.03)


def test_theorem1_intervals_follow_the_number_of_independent_draws(theorem_run) -> None:
    """One method for every point: an estimate of 0 and one of 0.015 get Wilson intervals over the same count of
    independent draws (the tables' intervals gave 0 over 2 sequences [0, 0.66] and 0.015 [0, 0.079]), four
    times the sequences narrow them as Wilson says, and the legend names the method and the count."""
    import copy

    one = theorem_run.tables["theorem1"]
    jl = one[(one["method"] == "jl") & (one["relative_to"] == "output")]
    count = independent_draws(theorem_run)
    assert count == 2 * 2 * 1  # the tiny model's 2 layers × 2 sequences × 1 draw
    more = copy.copy(theorem_run)
    more.tables = {**theorem_run.tables, "theorem1": one.assign(sequences=one["sequences"] * 4)}
    for run, n_draws in ((theorem_run, count), (more, 4 * count)):
        figure = report.draw_theorem1(run)
        ax = by_gid(figure.axes, "theorem1")
        for eps in (0.3, 0.5):
            check_bars(ax, eps, jl[jl["eps"] == eps].sort_values("budget"), n_draws)
        text = " ".join(" ".join(legend_texts(figure)).split())
        assert f"Wilson 95% interval over {n_draws} independent draws of R" in text
    assert wilson_interval(0.0, count)[1] == pytest.approx(Z * Z / (count + Z * Z))


def test_theorem1_fixed_projection_counts_one_draw_per_layer(theorem_run) -> None:
    import copy

    one = theorem_run.tables["theorem1"]
    fixed = copy.copy(theorem_run)
    fixed.tables = {**theorem_run.tables, "theorem1": one.assign(draws=0)}
    ax = by_gid(report.draw_theorem1(fixed).axes, "theorem1")
    jl = one[(one["method"] == "jl") & (one["relative_to"] == "output")]
    layers = theorem_run.tables["theorem1_layers"]["layer"].nunique()
    check_bars(ax, 0.5, jl[jl["eps"] == 0.5].sort_values("budget"), layers)


def test_theorem1_marks_k_inside_the_axis(tmp_path) -> None:
    """Synthetic n = 200: Theorem 1's k(0.5) = 40 ln 200 ≈ 212 lies inside the axis of k = 100, 200 (up to 250);
    k(0.3) ≈ 420 does not."""
    run = theorems(None, synthetic=True, d=4, heads=1, length=200, samples=1, budget=[100, 200], eps=[0.3, 0.5],
                   out=tmp_path / "synthetic", progress=None)
    ax = by_gid(report.draw_theorem1(run).axes, "theorem1")
    mark = by_gid(ax.lines, "k_theory:0.5")
    assert list(mark.get_xdata()) == [pytest.approx(5 * math.log(200) / (0.25 - 0.125))] * 2
    assert not [line for line in ax.lines if line.get_gid() == "k_theory:0.3"]
    colors = {to_hex(by_gid(ax.lines, gid).get_color()) for gid in ("k_theory:0.5", "pr:0.5", "bound:0.5")}
    assert len(colors) == 1


def test_theorem_errors_view(theorem_run) -> None:
    expected = expected_errors(theorem_run)
    figure = report.draw_theorem_errors(theorem_run)
    for stat in ("median", "p95"):
        ax = by_gid(figure.axes, stat)
        assert ax.get_yscale() == "log"
        for label, rows in expected.items():
            line = by_gid(ax.lines, label)
            np.testing.assert_array_equal(line.get_xdata(), BUDGETS)
            np.testing.assert_allclose(line.get_ydata(), rows[stat].to_numpy(), rtol=1e-12)
        check_below_marks(ax, expected)
    assert legend_texts(figure)[:len(expected)] == list(expected)  # the tables' names, e.g. linformer(kv)
    assert by_gid(figure.axes, "median").get_ylim() == by_gid(figure.axes, "p95").get_ylim()


def test_plot_theorems_figures_and_folders(theorem_run, approx_run, tmp_path, monkeypatch) -> None:
    names = fake_save(monkeypatch)
    report.plot_theorems(theorem_run, tmp_path / "thm")
    assert names == [str(tmp_path / "thm" / name) for name in ("theorem1_probability", "errors_vs_k")]
    with pytest.raises(SpectraError, match="this needs a run of 'spectra theorems'"):
        spectra.load_run(approx_run.path, "theorems")


def wrote(stdout: str) -> list[str]:
    return [line.removeprefix("wrote ") for line in stdout.splitlines() if line.startswith("wrote ")]


def test_cli_theorems_plot_flag(theorem_run, tmp_path, monkeypatch, capsys) -> None:
    """`spectra theorems RUN --plot` writes into RUN/figures (its rendering is checked above, so `save` is only
    recorded here, for speed)."""
    monkeypatch.chdir(tmp_path)
    recorded = fake_save(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["spectra", "theorems", str(theorem_run.path), "--plot"])
    cli.main()
    folder = f"{theorem_run.path}/figures"
    assert recorded == [f"{folder}/theorem1_probability", f"{folder}/errors_vs_k"]
    names = ("theorem1_probability", "errors_vs_k")
    assert wrote(capsys.readouterr().out) == [f"{folder}/{name}.{fmt}" for name in names for fmt in ("png", "pdf")]


def load_recipe():
    path = Path(__file__).resolve().parents[2] / "analyses" / "theorems.py"
    spec = importlib.util.spec_from_file_location("theorems_recipe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_theorems_recipe_uses_the_finished_run(roberta_dir, text_file, theorem_run, theorem_runs, tmp_path,
                                               monkeypatch, capsys) -> None:
    recipe = load_recipe()
    names = fake_save(monkeypatch)
    code = recipe.main(["--model", str(roberta_dir), "--data", str(text_file), "--length", str(N),
                        "--runs-dir", str(theorem_runs), "--out", str(tmp_path / "fig")])
    out, err = capsys.readouterr()
    assert code == 0 and "using finished run" in err
    assert names == [str(tmp_path / "fig" / name) for name in ("theorem1_probability", "errors_vs_k")]
    table = recipe.headline(theorem_run)
    labels = [*expected_errors(theorem_run), "theorem2(delta=1/2^n) vs rhs", "theorem2(delta=1/n) vs rhs"]
    assert sorted(table["method"]) == sorted(labels)
    two = theorem_run.tables["theorem2"]
    rhs = two[(two["relative_to"] == "rhs")]
    medians = {**{label: rows for label, rows in expected_errors(theorem_run).items()},
               **{f"theorem2({v}) vs rhs": rows.drop_duplicates("budget") for v, rows in rhs.groupby("variant")}}
    d = int(two["d"].iloc[0])
    for row in table.itertuples(index=False):
        rows = medians[row.method]
        reached = rows.loc[rows["median"] <= 0.1, "budget"]
        theorem_k = (5 * math.log(N) / (0.01 - 0.001) if row.method in ("jl", "svd")
                     else min(9 * d * math.log(d), 5 * math.log(N)) / 0.01)
        assert row.k_theory == pytest.approx(theorem_k)
        if len(reached):
            assert row.k_needed == reached.min() and row.ratio == pytest.approx(theorem_k / reached.min())
            assert f"{row.method}" in out and f"k = {reached.min()}; Theorem" in out
        else:
            assert math.isnan(row.k_needed) and row.ratio == pytest.approx(theorem_k / N)
    assert out.count("not in the sweep") == int((~table["reached"]).sum())
