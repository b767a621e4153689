"""Query, key and value spectra against an independent computation on a tiny Llama (grouped-query attention,
RoPE): the projections' outputs and transformers' own rotary embedding, then numpy's SVD and eigenvalues."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import spectra
from spectra import data
from spectra.probes.qkv import centred_eigenvalues, energy_ranks, gram, spectrum_ranks

N, SAMPLES = 20, 6


def ranks_of(x: np.ndarray) -> tuple[int, int]:
    sigma = np.linalg.svd(x, compute_uv=False)
    share = np.cumsum(sigma**2) / (sigma**2).sum()
    return tuple(int(np.searchsorted(share, e) + 1) for e in (0.9, 0.99))


def reference(model_dir, text_file):
    """Per (tensor, stage, layer, head): per-sequence ranks and the summed second moment, from eager's modules."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    inner, config = model.model, model.config
    d = config.hidden_size // config.num_attention_heads
    corpus = data.open_corpus(str(text_file), seed=0)
    ranks, second, pooled = {}, {}, {}
    with torch.no_grad():
        for batch in data.batches(tokenizer, corpus, N, "truncate", SAMPLES, 3):
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
            position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp_min(0)  # counted from the first valid token
            for layer, block in enumerate(inner.layers):
                x = block.input_layernorm(out.hidden_states[layer])
                attention = block.self_attn
                views = {}
                for which, linear, heads in (("q", attention.q_proj, config.num_attention_heads),
                                             ("k", attention.k_proj, config.num_key_value_heads),
                                             ("v", attention.v_proj, config.num_key_value_heads)):
                    views[which] = linear(x).view(*x.shape[:2], heads, d).transpose(1, 2)
                cos, sin = inner.rotary_emb(x, position_ids)
                q_rot, k_rot = apply_rotary_pos_emb(views["q"], views["k"], cos, sin)
                stages = {("q", "projection"): views["q"], ("k", "projection"): views["k"],
                          ("q", "attention"): q_rot, ("k", "attention"): k_rot, ("v", "attention"): views["v"]}
                for b, valid in enumerate(batch.attention_mask.bool()):
                    for cell, tensor in stages.items():
                        for head in range(tensor.shape[1]):
                            rows = tensor[b, head][valid].double().numpy()
                            ranks.setdefault((*cell, layer, head), []).append(ranks_of(rows))
                            second[(*cell, layer, head)] = second.get((*cell, layer, head), 0) + rows.T @ rows
                            pooled.setdefault((*cell, layer, head), []).append(rows)
    return ranks, second, {key: np.concatenate(parts) for key, parts in pooled.items()}


def pca_ranks_of(rows: np.ndarray) -> tuple[int, int]:
    """Centred ranks of pooled rows, straight from scipy: eigenvalues of their (biased) covariance."""
    eigenvalues = scipy.linalg.eigvalsh(np.cov(rows, rowvar=False, bias=True))[::-1]
    share = np.cumsum(eigenvalues) / eigenvalues.sum()
    return tuple(int(np.searchsorted(share, e) + 1) for e in (0.9, 0.99))


def test_qkv_tables_match_eager_modules_and_numpy(llama_dir, text_file, tmp_path) -> None:
    run = spectra.analyze(str(llama_dir), str(text_file), length=N, samples=SAMPLES, batch_size=3, mode="truncate",
                          out=tmp_path / "run", progress=None, notify=lambda line: None)
    assert run.meta["qkv"] is True and run.meta["rope"] is True, "on by default for a decoder with RoPE"
    assert run.meta["data"]["padding_side"] == "left" and run.meta["data"]["prefix_tokens"] == ["<s>"]
    ranks, second, pooled = reference(llama_dir, text_file)
    table = run.qkv.set_index(["tensor", "stage", "layer", "head"])
    assert len(table) == len(ranks) == 2 * (4 + 2 + 4 + 2 + 2)
    for key, values in ranks.items():
        row = table.loc[key]
        values = np.array(values, dtype=float)
        assert row["sequences"] == SAMPLES
        assert row["rank90_mean"] == pytest.approx(values[:, 0].mean()), key
        assert row["rank99_mean"] == pytest.approx(values[:, 1].mean()), key
        eigenvalues = np.linalg.eigvalsh(second[key])[::-1]
        share = np.cumsum(eigenvalues) / eigenvalues.sum()
        assert row["dataset_rank90"] == np.searchsorted(share, 0.9) + 1, key
        assert (row["pca_rank90"], row["pca_rank99"]) == pca_ranks_of(pooled[key]), key
    arrays = np.load(run.path / "qkv.npz")
    for (which, stage, layer, head), matrix in second.items():
        got = arrays[f"{which}_{stage}_eigenvalues"][layer, head]
        assert np.allclose(got, np.linalg.eigvalsh(matrix)[::-1], rtol=1e-5, atol=1e-8)
        rows = pooled[(which, stage, layer, head)]
        centred = scipy.linalg.eigvalsh(np.cov(rows, rowvar=False, bias=True))[::-1]
        assert np.allclose(arrays[f"{which}_{stage}_pca_eigenvalues"][layer, head], centred,
                           rtol=1e-4, atol=1e-6 * centred[0])
    assert np.all(arrays["tokens"] == len(pooled[("k", "projection", 0, 0)]))
    keys = table.xs(("k", "projection"), level=("tensor", "stage"))
    assert (keys["pca_rank90"] >= keys["dataset_rank90"]).all(), "removing the mean never lowers the rank here"


def test_centred_ranks_do_not_depend_on_the_batch_size(llama_dir, text_file, tmp_path) -> None:
    """The sums are exact pooled statistics, so batching moves them only by the forward pass's float32 rounding
    (batched matmuls of another shape): the ranks agree, the eigenvalues to float32 precision."""
    quiet = dict(length=N, samples=5, mode="truncate", progress=None, notify=lambda line: None)
    runs = [spectra.analyze(str(llama_dir), str(text_file), batch_size=size, out=tmp_path / str(size), **quiet)
            for size in (1, 2, 5)]
    for run in runs[1:]:
        pd.testing.assert_frame_equal(run.qkv.drop(columns=["rank90_std", "rank99_std"]),
                                      runs[0].qkv.drop(columns=["rank90_std", "rank99_std"]), check_exact=False,
                                      rtol=1e-12)
        first, other = np.load(runs[0].path / "qkv.npz"), np.load(run.path / "qkv.npz")
        for name in first.files:
            assert np.allclose(other[name], first[name], rtol=1e-5, atol=1e-7 * first[name].max()), name


def test_centred_eigenvalues_against_scipy_with_a_large_mean() -> None:
    """Rows whose mean is 300 standard deviations from zero, summed in three uneven parts: the covariance from
    Σxᵀx − N μμᵀ still matches scipy's on the centred rows, and its ranks are not the uncentred ones."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((500, 6)) * np.array([2.0, 1.5, 1.0, 0.5, 0.2, 0.05]) + 300.0
    second, sums = np.zeros((6, 6)), np.zeros(6)
    for part in np.split(rows, [7, 250]):
        second += part.T @ part
        sums += part.sum(0)
    got = centred_eigenvalues(second[None], sums[None], np.array([500.0]))[0]
    expected = scipy.linalg.eigvalsh(np.cov(rows, rowvar=False, bias=True))[::-1]
    assert np.allclose(got, expected, rtol=1e-6, atol=1e-9 * expected[0])
    assert spectrum_ranks(got).tolist() == list(pca_ranks_of(rows)) == [3, 4]
    assert spectrum_ranks(np.linalg.eigvalsh(second)[::-1]).tolist() == [1, 1], "the mean holds the energy"


def test_qkv_is_off_for_encoders_and_on_request(roberta_dir, text_file, tmp_path) -> None:
    quiet = dict(length=16, samples=2, progress=None, notify=lambda line: None)
    encoder = spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / "e", **quiet)
    assert encoder.qkv is None and encoder.meta["qkv"] is False
    asked = spectra.analyze(str(roberta_dir), str(text_file), qkv=True, out=tmp_path / "q", **quiet)
    assert asked.meta["rope"] is False and set(asked.qkv["stage"]) == {"attention"}, "no RoPE: one stage"


def test_rank_helpers_against_numpy() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, 4, generator=g) * torch.tensor([3.0, 1.0, 0.3, 0.01])
    valid = torch.tensor([[True] * 10, [True] * 6 + [False] * 4])
    got = energy_ranks(gram(x, valid))
    for b, m in enumerate((10, 6)):
        for h in range(3):
            assert tuple(got[b, h].tolist()) == ranks_of(x[b, h, :m].double().numpy())
    assert spectrum_ranks(np.array([[8.0, 1.0, 0.5, 0.5]])).tolist() == [[2, 4]]
