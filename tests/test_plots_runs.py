"""Figures of `approx` and `theorems` runs: files are written, and every plotted value is the run's stored value
(recomputed here with pandas from the tables), the Theorem 1 bound is the formula, and the CLI's --plot and the
analyses/theorems.py recipe work on real tiny runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from spectra import cli, plots
from spectra.pipeline import Settings, approx, theorems

QUIET = dict(progress=None, notify=lambda line: None)
N = 24
BUDGETS = [4, 8, N]  # k = n: svd and pool-mean are exact, so their zero errors sit below the log axis
METHODS = ["svd", "jl", "linformer(kv)", "pool-mean"]
SHARING = ["none", "headwise", "kv", "layerwise"]


@pytest.fixture(scope="module")
def approx_run(roberta_dir, text_file, tmp_path_factory):
    return approx(str(roberta_dir), str(text_file), budgets=BUDGETS, methods=METHODS, end_to_end=True, length=N,
                  samples=2, batch_size=2, out=tmp_path_factory.mktemp("approx") / "tiny-approx", **QUIET)


@pytest.fixture(scope="module")
def theorem_runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("theorem-runs")


@pytest.fixture(scope="module")
def theorem_run(roberta_dir, text_file, theorem_runs):
    """Named as analyses/theorems.py names it, so the recipe finds it finished."""
    out = theorem_runs / Settings(str(roberta_dir), str(text_file), N).default_out("theorems").name
    return theorems(str(roberta_dir), str(text_file), budgets=BUDGETS, eps=[0.3, 0.5], length=N, samples=2,
                    batch_size=2, out=out, **QUIET)


def by_gid(items, gid: str):
    found = [item for item in items if item.get_gid() == gid]
    assert len(found) == 1, (gid, [item.get_gid() for item in items])
    return found[0]


def legend_texts(figure) -> list[str]:
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def check_below_marks(ax, gids) -> None:
    """Every point under the log axis' bottom has a ▼ at its x; none above it does."""
    bottom = ax.get_ylim()[0]
    for gid in gids:
        line = by_gid(ax.lines, gid)
        y = np.asarray(line.get_ydata(), dtype=float)
        low = np.asarray(line.get_xdata(), dtype=float)[y < bottom]
        marks = [mark for mark in ax.lines if mark.get_gid() == f"below:{gid}"]
        if len(low):
            np.testing.assert_array_equal(marks[0].get_xdata(), low)
        else:
            assert not marks


def test_approx_views_plot_the_stored_values(approx_run) -> None:
    out_err = approx_run.heads[approx_run.heads["metric"] == "out_err"]
    per_layer = out_err.groupby(["method", "budget", "layer"])["mean"].mean()
    target = approx_run.meta["target"]

    figure = plots.draw_approx_layers(approx_run)
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

    figure = plots.draw_approx_budgets(approx_run)
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
    figure = plots.draw_end_to_end(approx_run)
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
    figure = plots.draw_end_to_end(dataclasses.replace(approx_run, end_to_end=drift_only))
    assert [ax.get_gid() for ax in figure.axes] == ["hidden_rel_err"]


def fake_save(monkeypatch) -> list[str]:
    """Record the figures `save` is asked for without rendering them (the CLI test renders real files)."""
    import matplotlib.pyplot as plt

    names: list[str] = []

    def save(figure, out):
        plt.close(figure)
        names.append(str(out))
        return [Path(f"{out}.png"), Path(f"{out}.pdf")]

    monkeypatch.setattr(plots, "save", save)
    return names


def test_plot_approx_figures_and_folders(approx_run, tmp_path, monkeypatch) -> None:
    names = fake_save(monkeypatch)
    paths = plots.plot_approx(approx_run.path, tmp_path / "views")
    assert names == [str(tmp_path / "views" / name) for name in ("error_vs_layer", "error_vs_k", "end_to_end")]
    assert len(paths) == 6
    names.clear()
    plots.plot_approx(dataclasses.replace(approx_run, end_to_end=None))  # without --end-to-end: two figures
    assert names == [str(Path("figures") / "tiny-approx" / name) for name in ("error_vs_layer", "error_vs_k")]
    (tmp_path / "file").write_text("")
    with pytest.raises(plots.SpectraError, match="not a directory"):
        plots.plot_approx(approx_run, tmp_path / "file")


def test_theorem1_view_probability_bound_and_k(theorem_run) -> None:
    one = theorem_run.tables["theorem1"]
    jl = one[one["method"] == "jl"]
    n = int(one["n"].iloc[0])
    figure = plots.draw_theorem1(theorem_run)
    ax = by_gid(figure.axes, "theorem1")
    for eps in (0.3, 0.5):
        rows = jl[jl["eps"] == eps].sort_values("k_proj")
        line = by_gid(ax.lines, f"pr:{eps:g}")
        np.testing.assert_array_equal(line.get_xdata(), BUDGETS)
        np.testing.assert_allclose(line.get_ydata(), rows["pr"].to_numpy(), rtol=1e-12)
        bound = by_gid(ax.lines, f"bound:{eps:g}")
        k = np.asarray(bound.get_xdata(), dtype=float)
        assert len(k) >= 100 and k[0] <= BUDGETS[0] and k[-1] >= BUDGETS[-1]  # a fine grid over the axis
        formula = [max(0.0, 1 - 2 * n * math.exp(-(eps**2 - eps**3) * x / 4)) for x in k]
        np.testing.assert_allclose(bound.get_ydata(), formula, rtol=1e-12, atol=1e-15)
        stored = [max(0.0, 1 - 2 * n * math.exp(-(eps**2 - eps**3) * x / 4)) for x in rows["k_proj"]]
        np.testing.assert_allclose(rows["bound"], stored, rtol=1e-12, atol=1e-15)
        # k(ε) = 5 ln n/(ε² − ε³) is far right of k ≤ 24: in the legend, not drawn
        k_theory = 5 * math.log(n) / (eps**2 - eps**3)
        assert f"ε = {eps:g}: k(ε) = {k_theory:,.0f}" in legend_texts(figure)
        assert not [item for item in ax.lines if item.get_gid() == f"k_theory:{eps:g}"]
    assert ax.get_xscale() == "log" and ax.get_ylim() == (-0.03, 1.03)


def test_theorem1_marks_k_inside_the_axis(tmp_path) -> None:
    """Synthetic n = 200: Theorem 1's k(0.5) = 40 ln 200 ≈ 212 lies inside the axis of k = 100, 200 (up to 250);
    k(0.3) ≈ 420 does not."""
    run = theorems(None, synthetic=True, d=4, heads=1, length=200, samples=1, budgets=[100, 200], eps=[0.3, 0.5],
                   out=tmp_path / "synthetic", progress=None)
    ax = by_gid(plots.draw_theorem1(run).axes, "theorem1")
    mark = by_gid(ax.lines, "k_theory:0.5")
    assert list(mark.get_xdata()) == [pytest.approx(5 * math.log(200) / (0.25 - 0.125))] * 2
    assert not [line for line in ax.lines if line.get_gid() == "k_theory:0.3"]
    colors = {to_hex(by_gid(ax.lines, gid).get_color()) for gid in ("k_theory:0.5", "pr:0.5", "bound:0.5")}
    assert len(colors) == 1


def expected_errors(run) -> dict[str, pd.DataFrame]:
    """label → rows (k_proj ascending) of median and p95, straight from the pooled tables."""
    one, two = run.tables["theorem1"], run.tables["theorem2"]
    found = {method: one[one["method"] == method] for method in ("jl", "svd")}
    for level in SHARING:
        found[f"linformer({level})"] = two[(two["method"] == "linformer") & (two["variant"] == level)]
    for rule in ("1/2^n", "1/n"):
        found[f"theorem2(delta={rule})"] = two[(two["method"] == "theorem2") & (two["variant"] == f"delta={rule}")
                                               & (two["relative_to"] == "output")]
    return {label: rows.drop_duplicates("k_proj").sort_values("k_proj") for label, rows in found.items()}


def test_theorem_errors_view(theorem_run) -> None:
    expected = expected_errors(theorem_run)
    figure = plots.draw_theorem_errors(theorem_run)
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
    plots.plot_theorems(theorem_run.path, tmp_path / "thm")
    assert names == [str(tmp_path / "thm" / name) for name in ("theorem1_probability", "errors_vs_k")]
    with pytest.raises(plots.SpectraError, match="not a theorems run"):
        plots.plot_theorems(approx_run.path, tmp_path / "thm")


def wrote(stdout: str) -> list[str]:
    return [line.removeprefix("wrote ") for line in stdout.splitlines() if line.startswith("wrote ")]


def test_cli_plot_flags(approx_run, theorem_run, tmp_path, monkeypatch, capsys) -> None:
    """`spectra approx RUN --plot` renders real files into figures/<run directory name>; `spectra theorems RUN
    --plot` the same way (its rendering is checked above, so `save` is only recorded here, for speed)."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "approx", str(approx_run.path), "--plot"])
    cli.main()
    names = ["error_vs_layer", "error_vs_k", "end_to_end"]
    expected = [f"figures/tiny-approx/{name}.{fmt}" for name in names for fmt in ("png", "pdf")]
    assert wrote(capsys.readouterr().out) == expected
    for path in expected[::2]:
        with Image.open(path) as image:
            assert image.info["dpi"][0] == pytest.approx(200, abs=1) and image.size[0] > 1000
    assert all(Path(path).read_bytes().startswith(b"%PDF") for path in expected[1::2])

    recorded = fake_save(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["spectra", "theorems", str(theorem_run.path), "--plot"])
    cli.main()
    folder = f"figures/{theorem_run.path.name}"
    assert recorded == [f"{folder}/theorem1_probability", f"{folder}/errors_vs_k"]
    names = ("theorem1_probability", "errors_vs_k")
    assert wrote(capsys.readouterr().out) == [f"{folder}/{name}.{fmt}" for name in names for fmt in ("png", "pdf")]


def load_recipe():
    path = Path(__file__).resolve().parents[1] / "analyses" / "theorems.py"
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
               **{f"theorem2({v}) vs rhs": rows.drop_duplicates("k_proj") for v, rows in rhs.groupby("variant")}}
    d = int(two["d"].iloc[0])
    for row in table.itertuples(index=False):
        rows = medians[row.method]
        reached = rows.loc[rows["median"] <= 0.1, "k_proj"]
        theorem_k = (5 * math.log(N) / (0.01 - 0.001) if row.method in ("jl", "svd")
                     else min(9 * d * math.log(d), 5 * math.log(N)) / 0.01)
        assert row.k_theory == pytest.approx(theorem_k)
        if len(reached):
            assert row.k_needed == reached.min() and row.ratio == pytest.approx(theorem_k / reached.min())
            assert f"{row.method}" in out and f"k = {reached.min()}; Theorem" in out
        else:
            assert math.isnan(row.k_needed) and row.ratio == pytest.approx(theorem_k / N)
    assert out.count("not in the sweep") == int((~table["reached"]).sum())
