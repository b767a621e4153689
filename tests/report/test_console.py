"""The terminal printers on real tiny runs: every number printed is the run's, recomputed here from its tables
(with pandas, not through spectra.report), and `spectra compare` prints the side-by-side tables."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pandas as pd
import pytest
from report_helpers import BUDGETS, METHODS, expected_errors, printed_tables
from tiny import run_cli

from spectra import cli
from spectra.api import approx
from spectra.report import analyze, console, scaling, theorems
from spectra.report import approx as approx_report
from spectra.report.plan import plan_k
from spectra.report.summaries import compare


def fixed(value: float, places: int = 3, missing: str = "") -> str:
    return missing if math.isnan(value) else f"{value:.{places}f}"


def test_print_analyze_rows_are_the_per_layer_means(runs, capsys) -> None:
    run = runs["deep-wiki"]
    analyze.show(run)
    out = capsys.readouterr().out
    assert out.startswith(f"{run.label} (encoder): n = {run.n}, 16 sequences, mean over {run.heads} heads per layer")
    (table,) = printed_tables(out)
    assert table["header"] == [["layer", f"c@{run.at}", "rank for 90%", "sink", "entropy"]]
    for layer, row in enumerate(table["rows"]):
        cells = run.metrics[run.metrics["layer"] == layer]
        assert row == [str(layer), fixed(cells["c_at_mean"].mean()), fixed(cells["rank90_mean"].mean(), 1),
                       fixed(cells["sink_mean"].mean()), fixed(cells["entropy_mean"].mean(), 2)]
    assert len(table["rows"]) == run.layers
    assert str(run.path) not in out, "the command line says where the results are, once for every kind"
    note = " ".join(out.split())  # issue 41, item 15: the encoder table said c@32 and "rank for 90%" without a word
    assert (f"c@{run.at}: the share of P's nuclear norm (the sum of its singular values) that its {run.at} largest "
            "singular values hold; rank for 90%: the fewest singular values holding 90% of it") in note
    assert "sink: mean attention of queries to the first token; entropy: of a query's attention, in nats" in note


def test_print_analyze_key_ranks_say_energy(llama_dir, text_file, tmp_path, capsys) -> None:
    """A decoder's table has the keys' dataset_rank90 per layer: the uncentred energy rank, which the header and the
    note call so (they called it the keys' variance, which is pca_rank90), before and after RoPE, each column saying
    which (the second said neither: issue 41, item 15)."""
    import spectra

    run = spectra.analyze(str(llama_dir), str(text_file), length=16, samples=4, out=tmp_path / "run", progress=None,
                          notify=lambda line: None)
    analyze.show(run)
    out = capsys.readouterr().out
    (table,) = printed_tables(out)
    header = [" ".join(part for part in column if part) for column in zip(*table["header"])]
    assert header[-2:] == ["key rank90 (energy) pre-RoPE", "key rank90 (energy) post-RoPE"], header
    keys = run.qkv[run.qkv["tensor"] == "k"]
    for layer, row in enumerate(table["rows"]):
        for cell, stage in zip(row[-2:], ("projection", "attention")):
            rows = keys[(keys["stage"] == stage) & (keys["layer"] == layer)]
            assert float(cell) == pytest.approx(rows["dataset_rank90"].mean(), abs=0.051)
    note = " ".join(out.split())
    assert ("key rank90 (energy): dimensions of the head holding 90% of the keys' energy Σkᵀk over the run, the mean "
            "key included (dataset_rank90 in qkv.csv; pca_rank90 there holds 90% of their variance, the mean "
            "removed)") in note


def test_print_approx_tables_match_the_run(approx_run, capsys) -> None:
    approx_report.show(approx_run)
    out = capsys.readouterr().out
    tables = printed_tables(out)
    assert len(tables) == len(BUDGETS) + 1  # one per k, then the smallest k reaching the target
    out_err = approx_run.head_stats[approx_run.head_stats["metric"] == "out_err"]
    per_layer = out_err.groupby(["method", "budget", "layer"])["mean"].mean()
    medians = out_err.groupby(["method", "budget", "layer"])["median"].mean()
    layers = sorted(out_err["layer"].unique())
    for budget, table in zip(BUDGETS, tables):
        assert f"{approx_run.label}, k = {budget}: relative head-output error" in out
        # headers from the method registry: linformer(kv) → lin / (kv), pool-mean → pool / mean
        assert table["header"] == [["", "", "", "lin", "pool"], ["layer", "svd", "jl", "(kv)", "mean"]]
        assert table["rows"] == [[str(layer), *(f"{fixed(per_layer[(method, budget, layer)])} "
                                                f"({fixed(medians[(method, budget, layer)])})" for method in METHODS)]
                                 for layer in layers]
        assert "mean (median) over sequences" in out
    assert "lin(s) = linformer with sharing s" in out

    target = approx_run.meta["target"]
    assert f"smallest k in the sweep with mean error ≤ {target} per layer" in out
    for layer, row in zip(layers, tables[-1]["rows"]):
        needed = []
        for method in METHODS:
            reached = [budget for budget in BUDGETS if per_layer[(method, budget, layer)] <= target]
            needed.append(str(min(reached)) if reached else "—")
        assert row == [str(layer), *needed]

    assert "end to end (all layers substituted):" in out
    for row in approx_run.end_to_end.itertuples(index=False):
        change = row.ppl / row.ppl_exact - 1
        shown = approx_report.signed_percent(change)
        assert shown == "no change" if change == 0 else float(shown[:-1]) != 0, "never (-0%)"
        line = (f"  {row.method}, k={row.budget}: hidden drift {row.hidden_rel_err:.3f}, cosine {row.cosine:.3f}, "
                f"ppl {row.ppl_exact:.3g} → {row.ppl:.3g} ({shown})")
        assert line in out.splitlines()


def test_print_theorems_tables_match_the_run(theorem_run, capsys) -> None:
    theorems.show(theorem_run)
    out = capsys.readouterr().out
    one = theorem_run.tables["theorem1"]
    n = int(one["n"].iloc[0])
    statement, proof, median, p95 = printed_tables(out)
    for form, probability in (("output", statement), ("rows", proof)):
        jl = one[(one["method"] == "jl") & (one["relative_to"] == form)]
        for k, row in zip(BUDGETS, probability["rows"]):
            cells = [jl[(jl["budget"] == k) & (jl["eps"] == eps)].iloc[0] for eps in (0.3, 0.5)]
            assert row == [str(k), *(f"{cell['pr']:.3f} [{cell['pr_low']:.3f}, {cell['pr_high']:.3f}] "
                                     f"({cell['bound']:.3f})" for cell in cells)]
        assert probability["header"] == [["k", "ε=0.3", "ε=0.5"]]
    assert "a fresh R per sequence (1 draw each)" in out and "the event its proof bounds" in out
    theorem_k = ", ".join(f"ε={eps:g}: {5 * math.log(n) / (eps**2 - eps**3):.0f}" for eps in (0.3, 0.5))
    assert f"Theorem 1's k = 5 ln n/(ε²−ε³): {theorem_k}" in out

    expected = expected_errors(theorem_run)  # jl, svd, linformer(<4 sharings>), theorem2(delta=<2 rules>)
    for stat, table in (("median", median), ("p95", p95)):
        assert table["rows"] == [[str(k), *(fixed(float(rows.loc[rows["budget"] == k, stat].iloc[0]))
                                            for rows in expected.values())] for k in BUDGETS]
    words = " ".join(" ".join(line) for line in median["header"])
    for name in ("svd", "(floor)", "thm2", "δ=1/2^n", "δ=1/n", "lin", "(kv)"):  # lin: the registry's header
        assert name in words

    two = theorem_run.tables["theorem2"]
    rhs = two[(two["method"] == "theorem2") & (two["relative_to"] == "rhs")].drop_duplicates(["variant", "budget"])
    largest = ", ".join(f"k={k}: {rhs[rhs['budget'] == k]['median'].max():.3g}" for k in BUDGETS)
    assert f"median (largest over δ): {largest}; its k" in out


def test_print_plan_tables_match_the_plan(runs, capsys) -> None:
    run = runs["deep-imdb"]
    for per_head in (False, True):
        plan = plan_k(run, 0.9, multiple=4, per_head=per_head)
        analyze.print_plan(run, plan)
        out = capsys.readouterr().out
        layers, costs = printed_tables(out)
        curves = run.cum_mean.mean(axis=1) if not per_head else run.cum_mean
        if per_head:
            k_head = plan.table["budget"].to_numpy().reshape(run.layers, run.heads)
            assert layers["rows"] == [[str(layer), str(k_head[layer].max()), *map(str, k_head[layer])]
                                      for layer in range(run.layers)]
            units, planned = run.layers * run.heads, run.n * k_head.sum()
        else:
            rows = []
            for layer, k in enumerate(plan.table["budget"]):
                rows.append([str(layer), str(plan.table["k_min"][layer]), str(k), fixed(curves[layer, k - 1])])
            assert layers["rows"] == rows
            units, planned = run.layers * run.heads, run.n * run.heads * plan.table["budget"].sum()
        uniform = int(plan.table["budget"].max())
        cost = [planned, units * run.n * uniform, units * run.n * run.n]
        names = ["nonuniform (this plan)", f"uniform budget = {uniform}", f"full (budget = n = {run.n})"]
        assert costs["rows"] == [[name, str(c), f"{planned / c:.1%}", f"{1 - planned / c:.1%}"]
                                 for name, c in zip(names, cost)]
        assert "reaches E = 0.9, rounded up to a multiple of 4" in out


def test_print_compare_tables_match_the_runs(runs, capsys) -> None:
    chosen = [runs["small-wiki"], runs["deep-imdb"]]
    analyze.print_compare(chosen, compare(chosen), None)
    out = capsys.readouterr().out
    lines = out.replace("\n", "")  # rich wraps a long path onto the next line
    assert lines.startswith(f"A  {chosen[0].label}, n = 32, 16 sequences: {chosen[0].path}")
    assert f"B  {chosen[1].label}, n = 32, 16 sequences: {chosen[1].path}" in lines
    per_layer, per_run = printed_tables(out)
    assert per_layer["header"] == [["layer", "A c@8", "A rank90", "B c@8", "B rank90"]]
    for layer, row in enumerate(per_layer["rows"]):
        cells = [str(layer)]
        for run in chosen:
            means = run.metrics[run.metrics["layer"] == layer][["c_at_mean", "rank90_mean"]].mean()
            cells += [fixed(means["c_at_mean"]), fixed(means["rank90_mean"], 1)]  # a 2-layer run: then empty
        assert row == cells
    assert len(per_layer["rows"]) == 3
    for key, run, row in zip("AB", chosen, per_run["rows"]):
        grid = run.metrics.pivot(index="layer", columns="head", values="c_at_mean").to_numpy()
        ranks = pd.Series(grid.mean(axis=1)).rank().to_numpy()
        rho = np.corrcoef(np.arange(len(ranks)), ranks)[0, 1]  # Spearman = Pearson of ranks
        assert row == [key, str(run.n), "16", str(run.at), fixed(grid.min()), fixed(grid.max()), fixed(grid.mean()),
                       fixed(rho, 2), fixed(run.metrics["rank90_mean"].mean(), 1)]


def test_cli_compare(runs, tmp_path, monkeypatch, capsys) -> None:
    paths = [str(runs[key].path) for key in ("small-wiki", "deep-wiki")]
    csv = tmp_path / "compare.csv"
    monkeypatch.setattr(sys, "argv", ["spectra", "compare", *paths, "--csv", str(csv)])
    cli.main()
    out = capsys.readouterr().out
    assert out.startswith("A  roberta-small · wikitext-103") and "\nB  roberta-deep · wikitext-103" in out
    assert "A c@8" in out and "B rank90" in out and "rho" in out
    table = pd.read_csv(csv)
    assert len(table) == 2 + 3 and set(table["layer"]) == {0, 1, 2}

    code, _, stderr = run_cli(["compare", *paths, str(runs["small-imdb-n16"].path), "--at", "20",
                               "--csv", str(tmp_path / "bad.csv")], monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and "1…16" in stderr and not (tmp_path / "bad.csv").exists()
    code, _, stderr = run_cli(["compare", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and "no run.json" in stderr and stderr.count("\n") == 1


def test_print_scaling_tables_match_the_run(scaling_run, capsys) -> None:
    scaling.show(scaling_run)
    out = capsys.readouterr().out
    ranks, fixed_k = printed_tables(out)
    assert ranks["header"][0] == ["layer", "n=16", "n=40", "n=64", "α", "95% interval", "fits better"]
    table, fits = scaling_run.table, scaling_run.exponents.query("metric == 'rank90' and method == ''")
    for row, layer in zip(ranks["rows"], [0, 1, "all"]):
        cells = table if layer == "all" else table[table["layer"] == layer]
        fit = fits[fits["scope"] == "pooled"] if layer == "all" else fits[(fits["scope"] == "layer") &
                                                                           (fits["layer"] == layer)]
        fit = fit.iloc[0]
        assert row[:5] == [str(layer), *(fixed(v, 1) for v in cells.groupby("n")["rank90"].mean()),
                           fixed(fit["alpha"], 2)]
        assert row[5] == f"[{fit['alpha_low']:.2f}, {fit['alpha_high']:.2f}]"
        assert row[6] == (fit["better"] or ("tie" if fit["rmse_power"] == fit["rmse_log"] else "n/a"))
    assert [row[0] for row in fixed_k["rows"]] == ["32", "n/4"]
    assert fixed_k["rows"][0][1] == "—" and fixed_k["rows"][0][2] == fixed(
        scaling_run.c_fixed.query("budget == 32 and n == 40")["c"].mean())
    assert fixed_k["rows"][1][1:] == [fixed(v) for v in table.groupby("n")["c_quarter"].mean()]
    pooled = fits[fits["scope"] == "pooled"].iloc[0]
    assert f"rank for 90%: α = {pooled['alpha']:.2f}" in out.replace("\n", " ")


def test_fitted_runs_print_calibration_gap_and_plan_tables(roberta_dir, text_file, tmp_path, capsys) -> None:
    """A run with fitted methods prints held-out against calibration errors (also without a random method),
    the fraction of the random-to-oracle gap each method closes, and a plan run its plan against uniform k;
    every number recomputed here from the run's tables."""
    quiet = dict(length=24, batch_size=4, progress=None, notify=lambda line: None)

    def layer_means(table: pd.DataFrame) -> pd.Series:
        rows = table[table["metric"] == "out_err"]
        return rows.groupby(["method", "budget", "layer"])["mean"].mean()

    run = approx(str(roberta_dir), str(text_file), budget=[4], methods=["pool-mean", "linformer-pca(kv)"],
                 samples=4, fit_samples=8, out=tmp_path / "fit", **quiet)
    approx_report.show(run)
    out = capsys.readouterr().out
    assert "fitted methods: mean head-output error over layers" in out and "fraction of the gap" not in out
    held, calibration = layer_means(run.head_stats), layer_means(run.calibration)
    fitted_table = printed_tables(out)[1]
    assert fitted_table["rows"] == [["linformer-pca(kv)", "4",
                                     fixed(calibration[("linformer-pca(kv)", 4)].mean()),
                                     fixed(held[("linformer-pca(kv)", 4)].mean())]]

    run = approx(str(roberta_dir), str(text_file), budget=[4], methods=["svd", "linformer(kv)", "linformer-pca(kv)"],
                 samples=4, fit_samples=8, out=tmp_path / "gap", **quiet)
    approx_report.show(run)
    out = capsys.readouterr().out
    assert "k = 4: fraction of the gap between the random projection" in out
    errors = layer_means(run.head_stats)
    gap_table = printed_tables(out)[-1]
    for row in gap_table["rows"]:
        layer = int(row[0])
        svd, random, pca = (errors[(method, 4, layer)] for method in ("svd", "linformer(kv)", "linformer-pca(kv)"))
        assert row[1:] == [f"{(random - pca) / (random - svd):.2f}"]

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"layers": [{"layer": 0, "budget": 4}, {"layer": 1, "budget": 12}]}))
    run = approx(str(roberta_dir), str(text_file), methods=["svd"], k_plan=plan, samples=4, out=tmp_path / "plan",
                 **quiet)
    approx_report.show(run)
    out = capsys.readouterr().out
    assert "k plan against a uniform k of equal total cost" in out
    planned, uniform = layer_means(run.plan), layer_means(run.head_stats)
    rows = printed_tables(out)[-1]["rows"]
    assert rows == [["svd", "0", "4", fixed(planned[("svd", 4, 0)]), "8", fixed(uniform[("svd", 8, 0)])],
                    ["svd", "1", "12", fixed(planned[("svd", 12, 1)]), "8", fixed(uniform[("svd", 8, 1)])]]


def test_a_wide_table_folds_to_the_terminal_width_repeating_the_row_keys(monkeypatch, capsys) -> None:
    """A table wider than the terminal is printed as several, each within the width and each repeating the columns
    that name a row (layer, head); together they hold every column once, in order, with the same cells."""
    rng = np.random.default_rng(0)
    measured = [f"score_{i}" for i in range(12)]
    frame = pd.DataFrame({"layer": np.repeat([0, 1], 3), "head": np.tile([0, 1, 2], 2), "head_type": ["local"] * 6,
                          **{name: rng.random(6) for name in measured}})
    monkeypatch.setattr(console, "out", console._Console(width=60, file=sys.stdout))
    console.print_frame(frame, "a title that is longer than sixty characters wraps between its words, never inside")
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 60
    assert [line.rstrip() for line in out.splitlines()[:2]] == [
        "a title that is longer than sixty characters wraps between", "its words, never inside"]
    tables = printed_tables(out)
    assert len(tables) > 1
    seen = []
    for table in tables:
        (header,) = table["header"]
        assert header[:2] == ["layer", "head"]
        seen += header[2:]
        for row, (_, expected) in zip(table["rows"], frame.iterrows()):
            assert row[:2] == [str(expected["layer"]), str(expected["head"])]
            assert row[2:] == [value if name == "head_type" else fixed(float(expected[name]))
                               for name, value in zip(header[2:], [expected[name] for name in header[2:]])]
    assert seen == ["head_type", *measured]
    monkeypatch.setattr(console, "out", console._Console(width=300, file=sys.stdout))
    console.print_frame(frame)
    assert len(printed_tables(capsys.readouterr().out)) == 1, "a table that fits is one table"


def test_a_two_length_scaling_run_says_why_no_model_fits_better(roberta_dir, text_file, tmp_path, capsys) -> None:
    """With two lengths both two-parameter models pass through every point: "fits better" says tie and a note says
    why (an empty column read as a missing result); the verdict follows α's interval."""
    from spectra.api import scaling as run_scaling
    from spectra.report.summaries import growth_reading

    run = run_scaling(str(roberta_dir), str(text_file), lengths=[16, 24], samples=3, bootstrap=20,
                  out=tmp_path / "two", progress=None, notify=lambda line: None)
    scaling.show(run)
    out = capsys.readouterr().out
    ranks = printed_tables(out)[0]
    assert [row[-1] for row in ranks["rows"]] == ["tie"] * len(ranks["rows"])
    assert "tie: both pass through every length (two lengths always do" in " ".join(out.split())
    pooled = run.exponents.query("scope == 'pooled' and method == '' and metric == 'rank90'").iloc[0]
    assert f"rank for 90%: {growth_reading(pooled['alpha'], pooled['alpha_low'], pooled['alpha_high'])}" in \
        " ".join(out.split())


def test_a_change_in_percent_is_never_shown_as_zero() -> None:
    """ppl changes print with the decimals it takes to show they are not zero ("(-0%)" read as no change)."""
    assert [approx_report.signed_percent(x) for x in (0.86, -0.003, 0.00004, -0.0149, 0.0)] == [
        "+86%", "-0.3%", "+0.004%", "-1%", "no change"]


@pytest.mark.parametrize("unit,seconds,shown", [("examples", 40.0, "40.0 s/example"), ("sequences", 0.25, "4.00 seq/s")])
def test_the_progress_bar_counts_its_unit_and_a_slow_one_in_seconds_each(unit, seconds, shown, monkeypatch) -> None:
    """A long task run's examples take tens of seconds each: the rate reads as seconds per example, not 0.02/s."""
    import io

    from rich.console import Console

    from spectra.report import console as console_module

    written, now = io.StringIO(), [0.0]
    monkeypatch.setattr(console_module, "console", Console(file=written, width=120, force_terminal=False,
                                                           get_time=lambda: now[0]))
    with console_module.progress_bar(unit) as update:
        for done in range(3):
            now[0] = done * seconds
            update(done, 4)
    text = written.getvalue()
    assert unit in text and shown in text and "2/4" in text, text
