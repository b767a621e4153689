"""End to end: masked-LM loss against eager attention on the same masked inputs, lossless substitution at k = n,
models without a masked-LM head, and every method family substituted into a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    RobertaModel,
)

from spectra import data, models
from spectra.api import approx
from spectra.errors import SpectraError
from spectra.probes.endtoend import mask_tokens

QUIET = dict(progress=None, notify=lambda line: None)
N, SAMPLES = 24, 6


def eager_batches(model_dir, text_file):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    corpus = data.open_corpus(str(text_file), seed=0)
    return list(data.batches(tokenizer, corpus, N, "pack", SAMPLES, batch_size=4))


def test_end_to_end_loss_matches_eager_and_exact_substitution_is_lossless(roberta_dir, text_file, tmp_path) -> None:
    run = approx(str(roberta_dir), str(text_file), budget=[4, N], methods=["pool-mean", "jl"], length=N,
                 samples=SAMPLES, batch_size=4, end_to_end=True, layers="1", out=tmp_path / "e2e", **QUIET)
    e2e = run.end_to_end.set_index(["method", "budget"])
    loaded = models.load(str(roberta_dir), device="cpu", lm_head=True)
    eager = AutoModelForMaskedLM.from_pretrained(roberta_dir, attn_implementation="eager").eval()
    total, count = 0.0, 0
    for batch in eager_batches(roberta_dir, text_file):
        ids, labels = mask_tokens(batch, loaded, seed=0)
        with torch.no_grad():
            logits = eager(input_ids=ids, attention_mask=batch.attention_mask).logits
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item()
        count += int((labels != -100).sum())
    assert count > 0 and e2e["masked_tokens"].iloc[0] == count
    assert e2e["loss_exact"].iloc[0] == pytest.approx(total / count, rel=1e-5)
    lossless = e2e.loc[("pool-mean", N)]
    assert lossless["hidden_rel_err"] == 0 and lossless["cosine"] == pytest.approx(1.0) and lossless["ppl_change"] == 0
    lossy = e2e.loc[("jl", 4)]
    assert lossy["hidden_rel_err"] > 0.01 and lossy["loss"] != lossy["loss_exact"]
    assert (e2e["layers"] == "1").all()


def test_without_mlm_head_only_drift_is_measured(tmp_path, text_file, roberta_dir) -> None:
    base = tmp_path / "base"
    RobertaModel.from_pretrained(roberta_dir).save_pretrained(base)
    AutoTokenizer.from_pretrained(roberta_dir).save_pretrained(base)
    lines: list[str] = []
    run = approx(str(base), str(text_file), budget=[4], methods=["svd"], length=N, samples=2, end_to_end=True,
                 out=tmp_path / "run", progress=None, notify=lines.append)
    assert any("no language-model head" in line for line in lines)
    assert "ppl" not in run.end_to_end.columns and run.end_to_end["hidden_rel_err"].iloc[0] > 0
    assert run.meta["masked_lm"] is False


def test_every_family_end_to_end(roberta_dir, text_file, tmp_path) -> None:
    n = 16
    run = approx(str(roberta_dir), str(text_file), budget=[4, n], length=n, samples=4, batch_size=2,
                 methods=["svd", "linformer(kv)", "performer", "nystrom", "skyformer", "probsparse"], end_to_end=True,
                 out=tmp_path / "run", progress=None, notify=lambda line: None)
    heads = run.head_stats.pivot_table(index=["method", "budget"], columns="metric", values="mean")
    assert set(heads.index.get_level_values("method")) == {"svd", "linformer(kv)", "performer", "nystrom",
                                                            "skyformer", "probsparse"}
    assert np.isfinite(heads[["out_err", "p_err", "tv"]].to_numpy()).all()
    for method in ("nystrom", "probsparse"):
        assert heads.loc[(method, n), "out_err"] < 1e-4, "k = n is exact"
        assert heads.loc[(method, 4), "out_err"] > 1e-2
    e2e = run.end_to_end.set_index(["method", "budget"])
    assert e2e.loc[("probsparse", n), "hidden_rel_err"] < 1e-5 and e2e.loc[("probsparse", 4), "hidden_rel_err"] > 1e-3
    assert np.isfinite(e2e["ppl"]).all()
    for budgets in ([0], [n + 1]):
        with pytest.raises(SpectraError, match="budget "):
            approx(str(roberta_dir), str(text_file), budget=budgets, length=n, samples=2, methods=["performer"],
                   out=tmp_path / "bad", progress=None, notify=lambda line: None)
    assert not (tmp_path / "bad").exists()


def test_next_token_loss_of_a_decoder_matches_eager(llama_dir, text_file, tmp_path) -> None:
    """A causal LM head: the standard shifted next-token loss over every predicted position, exact against eager
    attention on the same left-padded batches; a causal method at k = n is lossless."""
    n = 20
    run = approx(str(llama_dir), str(text_file), budget=[4, n], methods=["topk", "window"], length=n, samples=5,
                 batch_size=2, mode="truncate", end_to_end=True, out=tmp_path / "run", **QUIET)
    assert run.meta["lm_head"] == "causal-lm"
    e2e = run.end_to_end.set_index(["method", "budget"])
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    eager = AutoModelForCausalLM.from_pretrained(llama_dir, attn_implementation="eager").eval()
    corpus = data.open_corpus(str(text_file), seed=0)
    total, count = 0.0, 0
    for batch in data.batches(tokenizer, corpus, n, "truncate", 5, 2):
        mask = batch.attention_mask
        with torch.no_grad():
            logits = eager(input_ids=batch.input_ids, attention_mask=mask,
                           position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits
        for b in range(len(mask)):
            positions = mask[b].nonzero().flatten()
            ids = batch.input_ids[b, positions]
            rows = logits[b, positions][:-1]
            total += torch.nn.functional.cross_entropy(rows, ids[1:], reduction="sum").item()
            count += len(ids) - 1
    assert e2e["predicted_tokens"].iloc[0] == count and "masked_tokens" not in run.end_to_end.columns
    assert e2e["loss_exact"].iloc[0] == pytest.approx(total / count, rel=1e-5)
    for method in ("topk", "window"):
        assert e2e.loc[(method, n), "ppl_change"] == pytest.approx(0, abs=1e-5), "k = n is exact attention"
        assert e2e.loc[(method, 4), "hidden_rel_err"] > 1e-4


def test_a_non_causal_method_is_refused_end_to_end_on_a_decoder(llama_dir, text_file, tmp_path, monkeypatch,
                                                                 capsys) -> None:
    import tiny

    monkeypatch.chdir(tmp_path)
    code, out, err = tiny.run_cli(["approx", str(llama_dir), "--data", str(text_file), "--length", "16", "--samples",
                                   "2", "--budget", "4", "--methods", "linformer(kv),topk", "--end-to-end"], monkeypatch,
                                  capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "linformer(kv) lets each query see future tokens, so it is not a causal approximation" in lines[0]
    assert "window" in lines[0] and "topk" in lines[0]
    assert list(tmp_path.iterdir()) == []
    code, out, err = tiny.run_cli(["approx", str(llama_dir), "--data", str(text_file), "--length", "16", "--samples",
                                   "2", "--budget", "4", "--methods", "linformer(kv),svd"], monkeypatch, capsys)
    assert code == 0, "per head, a non-causal method is measured as on an encoder"
