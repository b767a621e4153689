"""Fitted projections in `spectra approx`: calibration and evaluation never overlap, the fitted methods' errors
against eq. 7 computed independently with the saved projections on eager attention's q, k, v, save → load →
the same outputs, the k plan, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny
import torch
from transformers import AutoModel, AutoTokenizer

from spectra import data
from spectra.api import approx
from spectra.capture import Captured
from spectra.methods import REGISTRY, Draws, Layer
from spectra.nn import linformer
from spectra.nn.descent import validation_split
from spectra.nn.projections import load_projections

QUIET = dict(progress=None, notify=lambda line: None)
N, FIT, SAMPLES = 24, 10, 6


@pytest.fixture(scope="module")
def fitted_run(roberta_dir, text_file, tmp_path_factory):
    return approx(str(roberta_dir), str(text_file), budget=[4, 8], methods=["svd", "linformer(kv)", "pool-mean",
                  "linformer-pca(kv)", "linformer-fit(kv)"], length=N, samples=SAMPLES, fit_samples=FIT, fit_steps=15,
                  batch_size=4, out=tmp_path_factory.mktemp("fit") / "run", **QUIET)


def eager_layers(model_dir, text_file, start: int, count: int):
    """Each evaluated sequence's records per layer from eager attention's modules (q, k, v of BERT-style layers)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    corpus = data.open_corpus(str(text_file), seed=0)
    found = []
    with torch.no_grad():
        for batch in data.batches(tokenizer, corpus, N, "pack", start + count, 4, skip=start):
            out = model(input_ids=batch.input_ids, output_hidden_states=True)
            for layer, block in enumerate(model.encoder.layer):
                hidden = out.hidden_states[layer]
                heads = [getattr(block.attention.self, name)(hidden).view(*hidden.shape[:2], 4, -1).transpose(1, 2)
                         for name in ("query", "key", "value")]
                found.append(Captured.of(layer, *heads, index=tuple(batch.index)))
    return found


def test_calibration_and_evaluation_never_overlap(fitted_run, roberta_dir, text_file) -> None:
    run = fitted_run
    assert run.meta["calibration"]["sequences"] == [0, FIT] and run.meta["evaluation"] == [FIT, FIT + SAMPLES]
    assert (run.head_stats["samples"] == SAMPLES).all() and (run.calibration["samples"] == FIT).all()
    assert set(run.fit_history["method"]) == {"linformer-fit(kv)"} and set(run.fit_history["budget"]) == {4, 8}
    # the fitted method's held-out errors: eq. 7 with the saved projections on sequences FIT … FIT + SAMPLES − 1
    projections = load_projections(run.path, "linformer-fit(kv)", 8)
    errors = {layer: [] for layer in range(2)}
    for record in eager_layers(roberta_dir, text_file, FIT, SAMPLES):
        x = Layer.of(record, use_p=False)
        exact = x.p @ x.v
        e, f = projections.pair(record.layer, N)
        approx_out = linformer.linear_attention(x.q, x.k, x.v, e, f, x.valid, x.scaling)
        errors[record.layer].append(((approx_out - exact).flatten(-2).norm(dim=-1)
                                     / exact.flatten(-2).norm(dim=-1)).double().numpy())
    table = run.head_stats[(run.head_stats["metric"] == "out_err") & (run.head_stats["method"] == "linformer-fit(kv)")
                      & (run.head_stats["budget"] == 8)].set_index(["layer", "head"])
    for layer, values in errors.items():
        values = np.concatenate(values)  # (sequences, heads)
        for head in range(4):
            assert table.loc[(layer, head), "mean"] == pytest.approx(values[:, head].mean(), rel=1e-4)


def test_saved_projections_load_into_the_linformer_layer(fitted_run) -> None:
    """save → load → the same outputs: the run's method, the loaded projections in eq. 7 and in a substitution."""
    projections = fitted_run.projections("linformer-fit(kv)", 4)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, N, 8, generator=g) for _ in range(3))
    record = Captured.of(1, q, k, v, index=(0, 1))
    fitted = REGISTRY["linformer-fit(kv)"].fresh()
    fitted.projections = {4: projections}
    method = fitted(Layer.of(record, use_p=False), 4, Draws.of(record))
    substituted = linformer.substitute(projections)(record)
    assert torch.allclose(method.out, substituted, atol=1e-5)
    with pytest.raises(Exception, match="no projections for linformer-fit\\(kv\\) at k = 16; it has"):
        fitted_run.projections("linformer-fit(kv)", 16)


def test_fitting_is_deterministic_and_says_how_long_it_takes(roberta_dir, text_file, tmp_path) -> None:
    lines: list[list[str]] = [[], []]
    runs = [approx(str(roberta_dir), str(text_file), budget=[4], methods=["linformer-fit(headwise)"], length=N,
                   samples=2, fit_samples=8, fit_steps=5, batch_size=4, out=tmp_path / f"r{i}", progress=None,
                   notify=lines[i].append)
            for i in range(2)]
    timing = [line for line in lines[0] if line.startswith("fitting linformer-fit(headwise) at k = 4:")]
    assert len(timing) == 1 and "the first of 2 layers took" in timing[0] and "min more" in timing[0]
    a, b = (run.projections("linformer-fit(headwise)", 4) for run in runs)
    for name in a.weights:
        assert torch.equal(a.weights[name], b.weights[name]), "same seed, same bits"


def test_a_k_plan_against_a_uniform_k_of_equal_cost(roberta_dir, text_file, tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"layers": [{"layer": 0, "budget": 4}, {"layer": 1, "budget": 12}]}))
    run = approx(str(roberta_dir), str(text_file), methods=["svd", "pool-mean"], k_plan=plan, length=N, samples=4,
                 batch_size=4, end_to_end=True, out=tmp_path / "run", **QUIET)
    assert run.meta["budget"] == [8] and run.meta["k_plan"] == [4, 12], "uniform k = the plan's mean: equal cost"
    planned = run.plan[run.plan["metric"] == "out_err"]
    assert set(zip(planned["layer"], planned["budget"])) == {(0, 4), (1, 12)}
    # the plan's per-head errors are each method's at the layer's own k: svd at k = 12 in layer 1 beats k = 8
    svd = run.per_layer("out_err", table="plan").set_index(["method", "layer"])["out_err"]
    uniform = run.per_layer("out_err").set_index(["method", "layer"])["out_err"]
    assert svd[("svd", 1)] < uniform[("svd", 1)] and svd[("svd", 0)] > uniform[("svd", 0)]
    assert set(run.end_to_end["allocation"]) == {"plan", "uniform"}


def test_fitted_methods_follow_the_k_plan(roberta_dir, text_file, tmp_path) -> None:
    """Under a plan, fitted projections exist at every planned k and at the uniform k: each layer's planned
    projections are the ones fitted at its own k (the same as a run at that uniform k, layer for layer)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"layers": [{"layer": 0, "budget": 4}, {"layer": 1, "budget": 12}]}))
    common = dict(methods=["linformer-pca(kv)"], length=N, samples=4, fit_samples=FIT, batch_size=4, **QUIET)
    run = approx(str(roberta_dir), str(text_file), k_plan=plan, end_to_end=True, out=tmp_path / "run", **common)
    for budget in (4, 8, 12):
        assert run.projections("linformer-pca(kv)", budget).budget == budget
    planned = run.per_layer("out_err", table="plan").set_index("layer")["out_err"]
    for layer, budget in ((0, 4), (1, 12)):
        alone = approx(str(roberta_dir), str(text_file), budget=[budget], out=tmp_path / f"k{budget}", **common)
        want = alone.per_layer("out_err").set_index("layer")["out_err"]
        assert planned[layer] == pytest.approx(want[layer], rel=1e-6)
    assert set(run.end_to_end["allocation"]) == {"plan", "uniform"}


@pytest.mark.parametrize("plan, message", [
    ({"layers": [{"layer": 0, "budget": 4}]}, "the k plan has 1 layers but tiny-roberta has 2"),
    ({"layers": [{"layer": 0, "budget": 4}, {"layer": 1, "budget": 99}]}, "budget 99 exceeds the sequence length"),
    ({"layers": [{"layer": 0, "budget": 0}, {"layer": 1, "budget": 4}]}, "every layer's budget must be at least 1"),
    ({"nothing": []}, "no list of layers"),
])
def test_bad_k_plans_are_one_line(plan, message, roberta_dir, text_file, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code, out, err = tiny.run_cli(["approx", str(roberta_dir), "--data", str(text_file), "--length", str(N),
                                   "--samples", "2", "--methods", "svd", "--k-plan", "plan.json"], monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_fitted_methods_need_a_calibration(roberta_dir, text_file, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = tiny.run_cli(["approx", str(roberta_dir), "--data", str(text_file), "--length", str(N),
                                   "--samples", "2", "--methods", "linformer-fit(kv)", "--budget", "4"], monkeypatch, capsys)
    assert code == 2 and "fits its parameters on calibration sequences: pass --fit-samples N" in err


def eager_decoder_heads(model_dir, text_file, n: int, start: int, count: int, monkeypatch):
    """q, k, v (grouped keys repeated per query head) and P V of every layer of the evaluated sequences
    start … start + count − 1 (truncate mode, left-padded), recorded inside transformers' eager attention, with each
    batch's valid keys: [(layer, q, k, v, p_v, valid)]."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama

    eager = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    original, seen = modeling_llama.eager_attention_forward, []

    def recording(module, query, key, value, attention_mask, scaling, **kwargs):
        out, weights = original(module, query, key, value, attention_mask, scaling, **kwargs)
        groups = module.num_key_value_groups
        k, v = (x.repeat_interleave(groups, dim=1) for x in (key, value))
        seen.append((module.layer_idx, query, k, v, weights @ v))
        return out, weights

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", recording)
    found = []
    corpus = data.open_corpus(str(text_file), seed=0)
    with torch.no_grad():
        for batch in data.batches(tokenizer, corpus, n, "truncate", start + count, 2, skip=start):
            mask = batch.attention_mask
            seen.clear()
            eager(input_ids=batch.input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))
            found += [(*record, mask.bool()) for record in seen]
    return found


def test_a_decoder_fits_fastformer_causal_and_refuses_a_linformer_fit(llama_dir, text_file, tmp_path, monkeypatch,
                                                                     capsys) -> None:
    """Calibration on a decoder's causal attention: a Linformer fit is refused in one line before any work;
    fastformer-fit-causal is fitted, and its held-out errors are the numpy formula's with the saved parameters on
    q, k, v recorded inside transformers' eager attention (left-padded batches); one fit serves every k."""
    from references import additive_attention_reference

    monkeypatch.chdir(tmp_path)
    code, out, err = tiny.run_cli(["approx", str(llama_dir), "--data", str(text_file), "--length", "16", "--samples",
                                   "2", "--budget", "4", "--fit-samples", "4", "--methods",
                                   "fastformer-fit-causal,linformer-fit(kv)"], monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "linformer-fit(kv) cannot be fitted on a decoder's causal attention" in lines[0]
    assert "fastformer-fit-causal" in lines[0] and list(tmp_path.iterdir()) == []

    n, fit, samples = 16, 6, 4
    run = approx(str(llama_dir), str(text_file), budget=[4, n], methods=["fastformer-fit-causal", "window"], length=n,
                 samples=samples, fit_samples=fit, fit_steps=10, batch_size=2, mode="truncate", end_to_end=True,
                 out=tmp_path / "run", **QUIET)
    assert run.meta["calibration"]["fitted"] == ["fastformer-fit-causal"]
    history = run.fit_history
    assert set(history["method"]) == {"fastformer-fit-causal"} and set(history["budget"]) == {-1}
    assert set(zip(history["layer"], history["head"])) == {(layer, head) for layer in range(2) for head in range(4)}
    arrays = np.load(run.path / "projections.npz")
    layers = list(arrays["fastformer-fit-causal|layers"])
    parameters = [arrays[f"fastformer-fit-causal|{name}"] for name in ("w_q", "w_k", "w_r", "b_r")]
    errors = {layer: [] for layer in range(2)}
    for layer, q, k, v, p_v, valid in eager_decoder_heads(llama_dir, text_file, n, fit, samples, monkeypatch):
        w_q, w_k, w_r, b_r = (x[layers.index(layer)] for x in parameters)
        for b in range(q.shape[0]):
            rows = valid[b].numpy()
            per_head = []
            for h in range(q.shape[1]):
                out = additive_attention_reference(*(x[b, h].double().numpy() for x in (q, k, v)), rows, True,
                                                   w_q[h], w_k[h], w_r[h], b_r[h])
                exact = p_v[b, h].double().numpy()
                per_head.append(np.linalg.norm((out - exact)[rows]) / np.linalg.norm(exact[rows]))
            errors[layer].append(per_head)
    heads = run.head_stats[(run.head_stats["metric"] == "out_err") & (run.head_stats["method"] == "fastformer-fit-causal")]
    for budget in (4, n):
        table = heads[heads["budget"] == budget].set_index(["layer", "head"])["mean"]
        for layer, values in errors.items():
            assert len(values) == samples
            for head in range(4):
                assert table[(layer, head)] == pytest.approx(np.mean([row[head] for row in values]), rel=1e-4)
    e2e = run.end_to_end.set_index(["method", "budget"])
    assert np.isfinite(e2e["ppl"]).all() and e2e.loc[("fastformer-fit-causal", 4), "hidden_rel_err"] > 0
    assert e2e.loc[("fastformer-fit-causal", 4), "loss"] == e2e.loc[("fastformer-fit-causal", n), "loss"]


@pytest.mark.parametrize("fit_samples, held", [(2, "1 sequence held out"), (8, "2 sequences held out")])
def test_the_calibration_notice_counts_what_is_held_out(fit_samples, held, roberta_dir, text_file, tmp_path) -> None:
    """The notice names the sequences the fit really holds out (`descent.validation_split`: at least one), in the
    right number: never "1 sequences", nor "0 sequences held out" when one is."""
    lines: list[str] = []
    approx(str(roberta_dir), str(text_file), budget=[4], methods=["linformer-fit(headwise)"], length=N, samples=1,
           fit_samples=fit_samples, fit_steps=1, batch_size=4, out=tmp_path / "run", progress=None,
           notify=lines.append)
    (notice,) = [line for line in lines if line.startswith("calibration:")]
    assert notice.startswith(f"calibration: {fit_samples} sequences, ") and f"({held} to choose the fit's step)" in notice
    assert "fitting 1 method at 1 budget" in notice, notice
    _, validation = validation_split(fit_samples, 0.25, 0)
    assert len(validation) == int(held.split()[0])
