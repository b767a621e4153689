"""`spectra theorems`: the run on a captured model against eager attention, pooling, synthetic mode, bad input."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from spectra import cli, data
from spectra.pipeline import theorems
from spectra.theory import Theorem1Probe

QUIET = dict(progress=None, notify=lambda line: None)
N = 24


def test_theorem1_on_a_model_matches_eager_attention(roberta_dir, text_file, tmp_path) -> None:
    run = theorems(str(roberta_dir), str(text_file), budgets=[4, 8], eps=[0.3, 0.5], length=N, samples=4,
                   batch_size=2, out=tmp_path / "run", **QUIET)
    model = AutoModel.from_pretrained(roberta_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    corpus = data.open_corpus(str(text_file), seed=0)
    probe = Theorem1Probe(2, 4, N, [4, 8], [0.3, 0.5])  # the same seeded R as the run's probe
    errors = {(layer, budget): [] for layer in range(2) for budget in (4, 8)}
    with torch.no_grad():
        for batch in data.batches(tokenizer, corpus, N, "pack", 4, 2):
            out = model(input_ids=batch.input_ids, output_attentions=True, output_hidden_states=True)
            for layer in range(2):
                hidden = out.hidden_states[layer]
                v = model.encoder.layer[layer].attention.self.value(hidden).view(*hidden.shape[:2], 4, -1)
                p, v = out.attentions[layer].double().numpy(), v.transpose(1, 2).double().numpy()
                for budget in (4, 8):
                    r = probe.r(layer, budget).double().numpy()
                    approx = p @ r.T @ r @ v
                    exact = p @ v
                    errors[(layer, budget)] += list((np.linalg.norm(approx - exact, axis=-2)
                                                     / np.linalg.norm(exact, axis=-2)).ravel())
    layers = run.tables["theorem1_layers"]
    for (layer, budget), values in errors.items():
        for eps in (0.3, 0.5):
            row = layers[(layers.layer == layer) & (layers.k_proj == budget) & (layers.method == "jl")
                         & (layers.eps == eps)].iloc[0]
            assert row["samples"] == len(values)
            assert row["pr"] == pytest.approx(np.mean(np.array(values) <= eps), abs=1e-9)
            assert row["mean"] == pytest.approx(np.mean(values), rel=1e-4)
    pooled = run.tables["theorem1"]
    heads = run.tables["theorem1_heads"]
    for (budget, method, eps), group in heads.groupby(["k_proj", "method", "eps"]):
        row = pooled[(pooled.k_proj == budget) & (pooled.method == method) & (pooled.eps == eps)].iloc[0]
        assert row["samples"] == group["samples"].sum()
        assert row["pr"] == pytest.approx(np.average(group["pr"], weights=group["samples"]))
        assert row["max"] == group["max"].max()


def test_synthetic_run_and_cli(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "theorems", "--synthetic", "--n", "32", "--d", "8", "--k", "4,16",
                                      "--eps", "0.5", "--samples", "3"])
    cli.main()
    out = capsys.readouterr().out
    assert "Theorem 1, P̃ = P RᵀR" in out and "ε=0.5" in out and "svd" in out
    run_dir = tmp_path / "runs" / "synthetic-n32-d8-theorems"
    assert (run_dir / "theorem2_heads.csv").exists()
    two = __import__("pandas").read_csv(run_dir / "theorem2.csv")
    assert set(two["variant"]) >= {"delta=1/2^n", "delta=1/n", "kv", "layerwise"}
    assert (two["samples"] == 3 * 32).all()


@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "k_proj must be a positive integer"),
    (["--k", "64"], "exceeds the sequence length n = 32"),
    (["--k", ""], "the k_proj sweep is empty"),
    (["--eps", "1.5"], "ε must lie strictly between 0 and 1"),
    (["--eps", "x"], "--eps 'x' is not a comma-separated list of numbers"),
])
def test_bad_input(args, message, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "theorems", "--synthetic", "--n", "32", "--samples", "1", "--k", "4", *args])
    with pytest.raises(SystemExit) as done:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and "\n" not in err and message in err, err
    assert list(tmp_path.iterdir()) == []
