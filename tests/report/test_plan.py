"""The nonuniform k plan, against independent computations, and `spectra plan-k`."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from spectra import cli
from spectra.report.plan import plan_k, read_plan, round_up, smallest_index
from tiny import run_cli


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
def test_plan_per_layer_matches_a_loop_over_the_mean_curve(runs, energy, multiple) -> None:
    run = runs["deep-wiki"]
    plan = plan_k(run, energy, multiple=multiple)
    assert list(plan.table.columns) == ["layer", "k_min", "budget", "c_at_budget"]
    for layer in range(run.layers):
        curve = run.cum_mean[layer].mean(axis=0)
        k_min = first_reaching(curve, energy)
        budget = min(run.n, math.ceil(k_min / multiple) * multiple)
        row = plan.table.iloc[layer]
        assert (row.layer, row.k_min, row.budget) == (layer, k_min, budget)
        assert row.c_at_budget == pytest.approx(curve[budget - 1]) and row.c_at_budget >= energy - 1e-6
    assert plan.uniform_budget == plan.table["budget"].max()


def test_plan_per_head_and_costs(runs) -> None:
    run = runs["deep-imdb"]
    plan = plan_k(run, 0.9, multiple=4, per_head=True)
    assert len(plan.table) == run.layers * run.heads
    expected = np.array([[min(run.n, math.ceil(first_reaching(run.cum_mean[l, h], 0.9) / 4) * 4)
                          for h in range(run.heads)] for l in range(run.layers)])
    np.testing.assert_array_equal(plan.table["budget"].to_numpy().reshape(run.layers, run.heads), expected)
    np.testing.assert_array_equal(plan.layer_budget, expected.max(axis=1))
    costs = plan.costs().set_index("attention")["cost"].to_numpy()
    cells = run.layers * run.heads
    assert list(costs) == [run.n * expected.sum(), cells * run.n * expected.max(), cells * run.n * run.n]
    document = plan.to_json()
    assert document["per_head"] is True and document["uniform_budget"] == expected.max()
    assert [entry["heads"] for entry in document["layers"]] == expected.tolist()
    assert [entry["budget"] for entry in document["layers"]] == expected.max(axis=1).tolist()

    shared = plan_k(run, 0.9)  # one budget per layer, shared by its heads
    k_layer = shared.table["budget"].to_numpy()
    assert shared.costs()["cost"].iloc[0] == run.heads * run.n * k_layer.sum()
    assert shared.costs()["saved"].iloc[1] == pytest.approx(1 - k_layer.sum() / (run.layers * k_layer.max()))
    assert shared.costs()["saved"].iloc[2] == pytest.approx(1 - k_layer.sum() / (run.layers * run.n))


def test_plan_multiple_larger_than_n_is_capped(runs) -> None:
    run = runs["small-wiki"]
    assert set(plan_k(run, 0.5, multiple=1000).table["budget"]) == {run.n}


def test_cli_plan_k_writes_the_json_and_prints_the_savings(runs, tmp_path, monkeypatch, capsys) -> None:
    run = runs["deep-wiki"]
    target = tmp_path / "plans" / "deep.json"
    monkeypatch.setattr(sys, "argv", ["spectra", "plan-k", str(run.path), "--energy", "0.95", "--out", str(target)])
    cli.main()
    out = capsys.readouterr().out
    document = json.loads(target.read_text())
    layers = [first_reaching(run.cum_mean[l].mean(axis=0), 0.95) for l in range(run.layers)]
    budget = [min(run.n, math.ceil(k / 8) * 8) for k in layers]
    assert document["n"] == run.n and document["energy"] == 0.95 and document["multiple"] == 8
    assert document["per_head"] is False and document["uniform_budget"] == max(budget)
    assert document["layers"] == [{"layer": l, "budget": k} for l, k in enumerate(budget)]
    assert document["cost"] == {"nonuniform": run.heads * run.n * sum(budget),
                                "uniform": run.layers * run.heads * run.n * max(budget),
                                "full": run.layers * run.heads * run.n * run.n}
    assert "saved" in out and f"uniform budget = {max(budget)}" in out and str(target) in out

    assert read_plan(target, run.n) == tuple(budget), "what plan-k writes, approx reads"
    old = {"n": run.n, "layers": [{"layer": l, "k_proj": k} for l, k in enumerate(budget)]}
    assert read_plan(old, run.n) == tuple(budget), "a plan written before k_proj was called budget still reads"

    monkeypatch.setattr(sys, "argv", ["spectra", "plan-k", str(run.path), "--per-head"])
    cli.main()  # default path: inside the run directory
    assert json.loads((run.path / "plan-k-e0.9-per-head.json").read_text())["per_head"] is True
    (run.path / "plan-k-e0.9-per-head.json").unlink()
    capsys.readouterr()


@pytest.mark.parametrize("args, needle", [
    (["--energy", "0"], "(0, 1]"), (["--energy", "1.5"], "(0, 1]"), (["--energy", "-0.2"], "(0, 1]"),
    (["--multiple", "0"], "--multiple"),
])
def test_cli_plan_k_bad_input(runs, tmp_path, monkeypatch, capsys, args, needle) -> None:
    target = tmp_path / "plan.json"
    code, _, stderr = run_cli(["plan-k", str(runs["small-wiki"].path), *args, "--out", str(target)],
                              monkeypatch, capsys)
    assert code == 2 and stderr.startswith("error:") and stderr.count("\n") == 1 and needle in stderr
    assert not target.exists()


def test_k_min_and_rank90_are_two_different_averages_as_documented(roberta_dir, text_file, tmp_path, monkeypatch,
                                                                   capsys) -> None:
    """analyze's rank90 is the mean over sequences of each sequence's smallest k with c ≥ 0.9; plan-k's k_min is
    the smallest k where the mean curve reaches E. From eager attention and scipy, sequence by sequence: both are
    what they say, both lie between the smallest and the largest per-sequence rank, they differ on this run, and
    plan-k prints why (as the README does)."""
    import scipy.linalg
    import torch
    from transformers import AutoModel, AutoTokenizer

    import spectra
    from spectra import data
    from spectra.report.analyze import RANK_VS_PLAN

    n, samples = 24, 12
    run = spectra.analyze(roberta_dir, text_file, length=n, samples=samples, out=tmp_path / "run", progress=None,
                          notify=lambda line: None)
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    model = AutoModel.from_pretrained(roberta_dir, attn_implementation="eager").eval()
    curves = []  # (sequences, layers, heads, n): each sequence's normalized cumulative singular values
    for batch in data.batches(tokenizer, data.open_corpus(str(text_file)), n, "pack", samples, 4):
        with torch.no_grad():
            attentions = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               output_attentions=True).attentions
        for p in torch.stack(attentions, dim=1).double().numpy():  # (layers, heads, n, n)
            sigma = np.array([[scipy.linalg.svdvals(head) for head in layer] for layer in p])
            curves.append(np.cumsum(sigma, -1) / sigma.sum(-1, keepdims=True))
    curves = np.array(curves)
    ranks = np.apply_along_axis(first_reaching, -1, curves, 0.9)  # (sequences, layers, heads)
    rank90 = run.metrics.set_index(["layer", "head"])["rank90_mean"].unstack().to_numpy()
    np.testing.assert_allclose(rank90, ranks.mean(axis=0), rtol=0, atol=1e-12)

    per_head = plan_k(run, 0.9, multiple=1, per_head=True).table.set_index(["layer", "head"])["k_min"].unstack()
    k_min = np.apply_along_axis(first_reaching, -1, curves.mean(axis=0), 0.9)
    np.testing.assert_array_equal(per_head.to_numpy(), k_min)
    assert (ranks.min(axis=0) <= k_min).all() and (k_min <= ranks.max(axis=0)).all()
    per_layer = plan_k(run, 0.9, multiple=1).table["k_min"].to_numpy()
    np.testing.assert_array_equal(per_layer, np.apply_along_axis(first_reaching, -1, curves.mean(axis=(0, 2)), 0.9))
    flat = ranks.transpose(1, 0, 2).reshape(run.layers, -1)
    assert (flat.min(axis=1) <= per_layer).all() and (per_layer <= flat.max(axis=1)).all()
    assert (k_min != rank90).any(), "the two averages differ on this run"

    code, out, err = run_cli(["plan-k", str(run.path), "--multiple", "1"], monkeypatch, capsys)
    assert code == 0 and RANK_VS_PLAN in " ".join(out.split()), out
