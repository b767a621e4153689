"""The nonuniform k plan, headline numbers and the compare table, against independent computations."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pandas as pd
import pytest

import spectra
from spectra import cli
from spectra.plan import compare, compare_wide, headline, layer_trend, plan_k, round_up, smallest_index
from test_plots import build_runs
from tiny import run_cli


@pytest.fixture(scope="session")
def plan_runs(tmp_path_factory) -> dict[str, spectra.Run]:
    return build_runs(tmp_path_factory.getbasetemp() / "spectra-tiny-runs")


def first_reaching(curve: np.ndarray, energy: float) -> int:
    """1-based index of the first value ≥ energy, by a plain loop; n when none."""
    for j, value in enumerate(curve, start=1):
        if value >= energy:
            return j
    return len(curve)


def test_smallest_index_and_rounding_by_hand() -> None:
    curve = np.array([0.5, 0.8, 0.9, 0.95, 0.99999994])
    assert list(smallest_index(curve, np.array(0.9))[None]) == [3]
    assert smallest_index(curve, 0.5) == 1 and smallest_index(curve, 0.96) == 5
    assert smallest_index(curve, 1.0) == 5  # round-off below 1: c_n = 1 by definition
    assert list(round_up(np.array([1, 8, 9, 16, 17, 500]), 8, 20)) == [8, 8, 16, 16, 20, 20]


@pytest.mark.parametrize("energy", [0.3, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("multiple", [1, 8])
def test_plan_per_layer_matches_a_loop_over_the_mean_curve(plan_runs, energy, multiple) -> None:
    run = plan_runs["deep-wiki"]
    plan = plan_k(run, energy, multiple=multiple)
    assert list(plan.table.columns) == ["layer", "k_min", "k_proj", "c_at_k_proj"]
    for layer in range(run.layers):
        curve = run.cum_mean[layer].mean(axis=0)
        k_min = first_reaching(curve, energy)
        k_proj = min(run.n, math.ceil(k_min / multiple) * multiple)
        row = plan.table.iloc[layer]
        assert (row.layer, row.k_min, row.k_proj) == (layer, k_min, k_proj)
        assert row.c_at_k_proj == pytest.approx(curve[k_proj - 1]) and row.c_at_k_proj >= energy - 1e-6
    assert plan.uniform_k_proj == plan.table["k_proj"].max()


def test_plan_per_head_and_costs(plan_runs) -> None:
    run = plan_runs["deep-imdb"]
    plan = plan_k(run, 0.9, multiple=4, per_head=True)
    assert len(plan.table) == run.layers * run.heads
    expected = np.array([[min(run.n, math.ceil(first_reaching(run.cum_mean[l, h], 0.9) / 4) * 4)
                          for h in range(run.heads)] for l in range(run.layers)])
    np.testing.assert_array_equal(plan.table["k_proj"].to_numpy().reshape(run.layers, run.heads), expected)
    np.testing.assert_array_equal(plan.layer_k_proj, expected.max(axis=1))
    costs = plan.costs().set_index("attention")["cost"].to_numpy()
    cells = run.layers * run.heads
    assert list(costs) == [run.n * expected.sum(), cells * run.n * expected.max(), cells * run.n * run.n]
    document = plan.to_json()
    assert document["per_head"] is True and document["uniform_k_proj"] == expected.max()
    assert [entry["heads"] for entry in document["layers"]] == expected.tolist()
    assert [entry["k_proj"] for entry in document["layers"]] == expected.max(axis=1).tolist()

    shared = plan_k(run, 0.9)  # one k_proj per layer, shared by its heads
    k_layer = shared.table["k_proj"].to_numpy()
    assert shared.costs()["cost"].iloc[0] == run.heads * run.n * k_layer.sum()
    assert shared.costs()["saved"].iloc[1] == pytest.approx(1 - k_layer.sum() / (run.layers * k_layer.max()))
    assert shared.costs()["saved"].iloc[2] == pytest.approx(1 - k_layer.sum() / (run.layers * run.n))


def test_plan_multiple_larger_than_n_is_capped(plan_runs) -> None:
    run = plan_runs["small-wiki"]
    assert set(plan_k(run, 0.5, multiple=1000).table["k_proj"]) == {run.n}


def test_cli_plan_k_writes_the_json_and_prints_the_savings(plan_runs, tmp_path, monkeypatch, capsys) -> None:
    run = plan_runs["deep-wiki"]
    target = tmp_path / "plans" / "deep.json"
    monkeypatch.setattr(sys, "argv", ["spectra", "plan-k", str(run.path), "--energy", "0.95", "--out", str(target)])
    cli.main()
    out = capsys.readouterr().out
    document = json.loads(target.read_text())
    layers = [first_reaching(run.cum_mean[l].mean(axis=0), 0.95) for l in range(run.layers)]
    k_proj = [min(run.n, math.ceil(k / 8) * 8) for k in layers]
    assert document["n"] == run.n and document["energy"] == 0.95 and document["multiple"] == 8
    assert document["per_head"] is False and document["uniform_k_proj"] == max(k_proj)
    assert document["layers"] == [{"layer": l, "k_proj": k} for l, k in enumerate(k_proj)]
    assert document["cost"] == {"nonuniform": run.heads * run.n * sum(k_proj),
                                "uniform": run.layers * run.heads * run.n * max(k_proj),
                                "full": run.layers * run.heads * run.n * run.n}
    assert "saved" in out and f"uniform k_proj = {max(k_proj)}" in out and str(target) in out

    monkeypatch.setattr(sys, "argv", ["spectra", "plan-k", str(run.path), "--per-head"])
    cli.main()  # default path: inside the run directory
    assert json.loads((run.path / "plan-k-e0.9-per-head.json").read_text())["per_head"] is True
    (run.path / "plan-k-e0.9-per-head.json").unlink()
    capsys.readouterr()


@pytest.mark.parametrize("args, needle", [
    (["--energy", "0"], "(0, 1]"), (["--energy", "1.5"], "(0, 1]"), (["--energy", "-0.2"], "(0, 1]"),
    (["--multiple", "0"], "--multiple"),
])
def test_cli_plan_k_bad_input(plan_runs, tmp_path, monkeypatch, capsys, args, needle) -> None:
    target = tmp_path / "plan.json"
    code, _, stderr = run_cli(["plan-k", str(plan_runs["small-wiki"].path), *args, "--out", str(target)],
                              monkeypatch, capsys)
    assert code == 2 and stderr.startswith("error:") and stderr.count("\n") == 1 and needle in stderr
    assert not target.exists()


def test_headline_and_layer_trend(plan_runs) -> None:
    run = plan_runs["deep-wiki"]
    numbers = headline(run)
    grid = run.metrics.pivot(index="layer", columns="head", values="c_at_mean").to_numpy()
    assert (numbers["c_min"], numbers["c_max"]) == (grid.min(), grid.max()) and numbers["at"] == run.n // 4
    means = pd.Series(grid.mean(axis=1))
    ranks = means.rank().to_numpy()
    rho = np.corrcoef(np.arange(len(ranks)), ranks)[0, 1]  # Spearman = Pearson of ranks
    assert numbers["layer_rho"] == pytest.approx(rho)
    assert math.isnan(layer_trend(np.ones((3, 2))))


def test_compare_table_side_by_side(plan_runs) -> None:
    runs = [plan_runs["small-wiki"], plan_runs["small-imdb-n16"], plan_runs["deep-imdb"]]
    table = compare(runs)
    assert list(table.columns) == ["run", "n", "at", "layer", "c_at", "rank90", "rank99"]
    for run in runs:
        rows = table[table["run"] == run.label]
        per_layer = run.metrics.groupby("layer")[["c_at_mean", "rank90_mean", "rank99_mean"]].mean()
        np.testing.assert_array_equal(rows["layer"], np.arange(run.layers))
        np.testing.assert_allclose(rows["c_at"].to_numpy(), per_layer["c_at_mean"].to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(rows["rank90"].to_numpy(), per_layer["rank90_mean"].to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(rows["rank99"].to_numpy(), per_layer["rank99_mean"].to_numpy(), rtol=1e-12)
        assert set(rows["at"]) == {run.n // 4} and set(rows["n"]) == {run.n}
    # the same model and dataset at two lengths: the names carry n
    lengths = compare([plan_runs["small-imdb"], plan_runs["small-imdb-n16"]])
    assert list(dict.fromkeys(lengths["run"])) == ["roberta-small · imdb n=32", "roberta-small · imdb n=16"]
    wide = compare_wide(table)
    assert list(wide.columns) == ["layer", "A c@8", "A rank90", "B c@4", "B rank90", "C c@8", "C rank90"]
    assert list(wide["layer"]) == [0, 1, 2] and wide["A c@8"].notna().sum() == 2  # 2 layers, then empty
    np.testing.assert_allclose(wide["C rank90"], table[table["run"] == runs[2].label]["rank90"])
    explicit = compare(runs[:1], at=3)
    np.testing.assert_allclose(explicit["c_at"], runs[0].cum_mean[:, :, 2].mean(axis=1))


def test_cli_compare(plan_runs, tmp_path, monkeypatch, capsys) -> None:
    paths = [str(plan_runs[key].path) for key in ("small-wiki", "deep-wiki")]
    csv = tmp_path / "compare.csv"
    monkeypatch.setattr(sys, "argv", ["spectra", "compare", *paths, "--csv", str(csv)])
    cli.main()
    out = capsys.readouterr().out
    assert out.startswith("A  roberta-small · wikitext-103") and "\nB  roberta-deep · wikitext-103" in out
    assert "A c@8" in out and "B rank90" in out and "rho" in out
    table = pd.read_csv(csv)
    assert len(table) == 2 + 3 and set(table["layer"]) == {0, 1, 2}

    code, _, stderr = run_cli(["compare", *paths, str(plan_runs["small-imdb-n16"].path), "--at", "20",
                               "--csv", str(tmp_path / "bad.csv")], monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and "1…16" in stderr and not (tmp_path / "bad.csv").exists()
    code, _, stderr = run_cli(["compare", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and "no run.json" in stderr and stderr.count("\n") == 1
