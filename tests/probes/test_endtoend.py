"""End to end: masked-LM loss against eager attention on the same masked inputs, lossless substitution at k = n,
models without a masked-LM head, and every method family substituted into a model."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, RobertaModel

from spectra import data, models
from spectra.errors import SpectraError
from spectra.probes.endtoend import mask_tokens
from spectra.api import approx

QUIET = dict(progress=None, notify=lambda line: None)
N, SAMPLES = 24, 6


def eager_batches(model_dir, text_file):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    corpus = data.open_corpus(str(text_file), seed=0)
    return list(data.batches(tokenizer, corpus, N, "pack", SAMPLES, batch_size=4))


def test_end_to_end_loss_matches_eager_and_exact_substitution_is_lossless(roberta_dir, text_file, tmp_path) -> None:
    run = approx(str(roberta_dir), str(text_file), budgets=[4, N], methods=["pool-mean", "jl"], length=N,
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
    run = approx(str(base), str(text_file), budgets=[4], methods=["svd"], length=N, samples=2, end_to_end=True,
                 out=tmp_path / "run", progress=None, notify=lines.append)
    assert any("no language-model head" in line for line in lines)
    assert "ppl" not in run.end_to_end.columns and run.end_to_end["hidden_rel_err"].iloc[0] > 0
    assert run.meta["masked_lm"] is False


def test_every_family_end_to_end(roberta_dir, text_file, tmp_path) -> None:
    n = 16
    run = approx(str(roberta_dir), str(text_file), budgets=[4, n], length=n, samples=4, batch_size=2,
                 methods=["svd", "linformer(kv)", "performer", "nystrom", "skyformer", "probsparse"], end_to_end=True,
                 out=tmp_path / "run", progress=None, notify=lambda line: None)
    heads = run.heads.pivot_table(index=["method", "budget"], columns="metric", values="mean")
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
        with pytest.raises(SpectraError, match="k = "):
            approx(str(roberta_dir), str(text_file), budgets=budgets, length=n, samples=2, methods=["performer"],
                   out=tmp_path / "bad", progress=None, notify=lambda line: None)
    assert not (tmp_path / "bad").exists()
