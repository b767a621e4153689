"""`spectra approx` per head: the error measures against numpy, a run's per-head errors against an independent
dense computation on eager attention, the terminal tables, and bad input."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from layers import H, random_layer
from layers import N as LN
from transformers import AutoModel, AutoTokenizer

from layers import approximate
from spectra import cli, data
from spectra.api import approx
from spectra.probes.approx import measures

QUIET = dict(progress=None, notify=lambda line: None)
N, SAMPLES = 24, 6


def test_measures_against_numpy() -> None:
    x = random_layer((LN, 6))
    approx = approximate("jl", x, 4)
    got = measures(x, approx)
    for b, m in enumerate((LN, 6)):
        for h in range(H):
            p, p_t = x.p[b, h, :m, :m].numpy(), approx.p[b, h, :m, :m].numpy()
            exact, out = p @ x.v[b, h, :m].numpy(), approx.out[b, h, :m].numpy()
            assert got[0, b, h] == pytest.approx(np.linalg.norm(out - exact) / np.linalg.norm(exact))
            assert got[1, b, h] == pytest.approx(np.linalg.norm(p - p_t) / np.linalg.norm(p))
            pos = np.clip(p_t, 0, None)
            tv = [0.5 * np.abs(p[i] - pos[i] / pos[i].sum()).sum() if pos[i].sum() > 0 else 1.0 for i in range(m)]
            assert got[2, b, h] == pytest.approx(np.mean(tv))
    assert measures(x, approximate("pool-max", x, 4))[1:].isnan().all()


def eager_batches(model_dir, text_file):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    corpus = data.open_corpus(str(text_file), seed=0)
    return list(data.batches(tokenizer, corpus, N, "pack", SAMPLES, batch_size=4))


def test_per_head_errors_match_dense_numpy(roberta_dir, text_file, tmp_path) -> None:
    run = approx(str(roberta_dir), str(text_file), budget=[4, 12], methods=["svd", "pool-mean"], length=N,
                 samples=SAMPLES, batch_size=4, out=tmp_path / "run", **QUIET)
    model = AutoModel.from_pretrained(roberta_dir, attn_implementation="eager").eval()
    errors = {key: [] for key in [("svd", 4), ("svd", 12), ("pool-mean", 12)]}
    torch.set_grad_enabled(False)
    for batch in eager_batches(roberta_dir, text_file):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True,
                    output_hidden_states=True)
        for layer, p_layer in enumerate(out.attentions):
            attn = model.encoder.layer[layer].attention.self
            hidden = out.hidden_states[layer]
            v = attn.value(hidden).view(*hidden.shape[:2], 4, -1).transpose(1, 2).double().numpy()
            p_all = p_layer.double().numpy()
            for b in range(p_all.shape[0]):
                for h in range(4):
                    p, vh = p_all[b, h], v[b, h]
                    exact = p @ vh
                    u, s, wt = np.linalg.svd(p)
                    for budget in (4, 12):
                        approx_out = (u[:, :budget] * s[:budget]) @ wt[:budget] @ vh
                        errors[("svd", budget)].append((layer, h, np.linalg.norm(approx_out - exact) / np.linalg.norm(exact)))
                    # pool-mean at k = 12 over n = 24: windows of two tokens, equal sizes
                    q = model.encoder.layer[layer].attention.self.query(hidden)[b].view(N, 4, -1)[:, h].double().numpy()
                    k = attn.key(hidden)[b].view(N, 4, -1)[:, h].double().numpy()
                    k_bar, v_bar = k.reshape(12, 2, -1).mean(1), vh.reshape(12, 2, -1).mean(1)
                    logits = q @ k_bar.T / math.sqrt(q.shape[-1])
                    w = np.exp(logits - logits.max(-1, keepdims=True))
                    pooled = (w / w.sum(-1, keepdims=True)) @ v_bar
                    errors[("pool-mean", 12)].append((layer, h, np.linalg.norm(pooled - exact) / np.linalg.norm(exact)))
    torch.set_grad_enabled(True)
    table = run.head_stats[run.head_stats["metric"] == "out_err"].set_index(["method", "budget", "layer", "head"])
    for (method, budget), rows in errors.items():
        for layer in range(2):
            for h in range(4):
                values = [e for (l, hh, e) in rows if l == layer and hh == h]
                row = table.loc[(method, budget, layer, h)]
                assert row["samples"] == SAMPLES
                assert row["mean"] == pytest.approx(np.mean(values), rel=1e-4, abs=1e-6)
                low, high = np.sort(values)[[SAMPLES // 2 - 1, SAMPLES // 2]]  # the median lies between
                assert low * 0.975 - 1e-9 <= row["median"] <= high * 1.025 + 1e-9
                assert row["pr_below_target"] == pytest.approx(np.mean(np.array(values) <= 0.1))


@pytest.mark.parametrize("args, message", [
    (["--budget", "0"], "budget 0 is not a positive integer"),
    (["--budget", "32"], "budget 32 exceeds the sequence length n = 24"),
    (["--budget", "a,b"], "--budget 'a,b' is not a comma-separated list"),
    (["--methods", "svd,lsh"], "unknown method 'lsh'; valid methods:"),
    (["--end-to-end", "--layers", "5"], "--layers must lie in 0…1"),
    (["--layers", "x-y"], "--layers 'x-y' is not a list of layers"),
    (["--target", "2"], "--target must be a relative error in (0, 1)"),
])
def test_bad_input(args, message, roberta_dir, text_file, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "approx", str(roberta_dir), "--data", str(text_file),
                                      "--length", str(N), "--samples", "2", "--budget", "4", *args])
    with pytest.raises(SystemExit) as done:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and "\n" not in err and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_cli_prints_tables_and_replots(roberta_dir, text_file, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "approx", str(roberta_dir), "--data", str(text_file), "--length",
                                      str(N), "--samples", "2", "--budget", "4,8", "--methods", "svd,linformer(kv)",
                                      "--end-to-end"])
    cli.main()
    out = capsys.readouterr().out
    assert "k = 4: relative head-output error" in out and "smallest k in the sweep" in out
    assert "linformer(kv), k=8: hidden drift" in out and "ppl" in out
    monkeypatch.setattr(sys, "argv", ["spectra", "approx", f"runs/tiny-roberta-corpus-n{N}-approx"])
    cli.main()
    assert "k = 8: relative head-output error" in capsys.readouterr().out
