"""`spectra heads` on a model built by hand: a 2-layer Llama (RoPE on, MLPs zero) whose head (0, 0) is an exact
previous-token head and head (1, 0) an exact induction head; the scores are 1 there and low elsewhere. Also the
encoder convention, the method map joined with an approx run, the DuoAttention pattern, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tiny
import torch

import spectra
from spectra.kv import headpattern
from spectra.checkpoints import Shape
from spectra.config import RunConfig
from spectra.errors import SpectraError
from spectra.kinds import REGISTRY
from spectra.kinds.heads import HeadsOptions

CODE = 32  # token code dimension: residual = [code of the token | code of the previous token]
ROPE_THETA = 1e16  # head pairs f ≥ 10 turn by ≤ 1e-5 per position: what they carry is blind to position
CONTENT = [*range(10, 32), *range(42, 52)]  # 32 head dimensions in those pairs (pair f = dims f and f + 32)


def save_circuit(path: Path, vocab: int = 4096, seed: int = 0) -> Path:
    """Head (0, 0): q and k from biases alone, k turned one position ahead of q in the fast RoPE pairs 0…3, so
    q_i·k_j peaks at j = i − 1 (the logit gap to any other key ≥ 0.51 · 300); its values read the token's code and
    its output writes it into the residual's second half. Head (1, 0): query = the token's code, key = the previous
    token's code (from head (0, 0)), in position-blind pairs: it attends to the token after an earlier occurrence.
    Heads (0, 1) and (1, 1) are zero (uniform attention). Codes: random unit vectors for a 4096-token vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny._decoder_tokenizer("llama")
    config = LlamaConfig(vocab_size=vocab, hidden_size=2 * CODE, head_dim=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=8, attention_bias=True,
                         max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    codes = np.random.default_rng(seed).standard_normal((vocab, CODE))
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    theta = ROPE_THETA ** (-np.arange(0, 64, 2) / 64)
    beta = np.sqrt(8 * 300)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for layer in model.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.model.embed_tokens.weight[:, :CODE] = torch.tensor(codes, dtype=torch.float32)
        first, second = model.model.layers[0].self_attn, model.model.layers[1].self_attn
        for f in range(4):
            first.q_proj.bias[f] = beta
            first.k_proj.bias[f], first.k_proj.bias[f + 32] = beta * np.cos(theta[f]), beta * np.sin(theta[f])
        first.v_proj.weight[:CODE, :CODE] = torch.eye(CODE)
        first.o_proj.weight[CODE:, :CODE] = torch.eye(CODE) / np.sqrt(CODE)  # undoes the norm's √32
        for i, dim in enumerate(CONTENT):
            second.q_proj.weight[dim, i] = 10.0
            second.k_proj.weight[dim, CODE + i] = 10.0
            second.o_proj.weight[i, dim] = 1.0  # a layer output, so streaming changes something
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def circuit_run(tmp_path_factory, text_file):
    model = save_circuit(tmp_path_factory.mktemp("models") / "circuit")
    return spectra.heads(str(model), str(text_file), length=48, samples=4, batch_size=2, window=8, recent=8,
                         out=tmp_path_factory.mktemp("heads") / "circuit-run", progress=None, notify=lambda line: None)


def cell(run, layer: int, head: int) -> pd.Series:
    table = run.diagnosis
    return table[(table["layer"] == layer) & (table["head"] == head)].iloc[0]


def test_the_hand_built_heads_score_1_and_the_others_low(circuit_run) -> None:
    from spectra.anatomy.diagnosis import INDUCTION_TOKENS, induction_tokens
    from spectra.seeds import Domain, derive_seed

    tokens = induction_tokens(4096, [0, 1, 2], 1, derive_seed(0, Domain.INDUCTION))[:, 1:1 + INDUCTION_TOKENS]
    assert all(len(set(row)) == INDUCTION_TOKENS for row in tokens), "no token repeats within a block: one match"
    assert cell(circuit_run, 0, 0)["prev"] == pytest.approx(1, abs=1e-5)
    assert cell(circuit_run, 1, 0)["induction_score"] == pytest.approx(1, abs=1e-5)
    assert cell(circuit_run, 0, 0)["head_type"] == "previous-token"
    assert cell(circuit_run, 1, 0)["head_type"] == "induction"
    others = circuit_run.diagnosis.drop(index=[0])
    assert (others["prev"] < 0.1).all()
    induction = circuit_run.diagnosis.set_index(["layer", "head"])["induction_score"].drop(index=[(1, 0)])
    assert (induction < 0.05).all()
    assert cell(circuit_run, 0, 0)["local"] == pytest.approx(1, abs=1e-5), "the previous token lies within 8"
    assert cell(circuit_run, 0, 0)["retrieval"] == pytest.approx(0, abs=1e-6), "a window of 8 keeps all it reads"
    assert cell(circuit_run, 0, 0)["top10"] == pytest.approx(1, abs=1e-5)
    assert cell(circuit_run, 0, 1)["entropy"] > 2, "a zero head attends uniformly"


def test_the_weight_ranks_of_the_hand_built_heads(circuit_run) -> None:
    assert cell(circuit_run, 1, 0)["qk_rank90"] > 0 and cell(circuit_run, 0, 1)["qk_rank90"] == 0
    assert cell(circuit_run, 0, 0)["qk_rank90"] == 0, "its q and k come from biases: W_QK is zero"
    sigma = circuit_run.weights["ov_sigma"][0, 0]
    np.testing.assert_allclose(sigma[:CODE], 1 / np.sqrt(CODE), rtol=1e-6)  # W_OV = I/√32 on 32 dimensions
    assert cell(circuit_run, 0, 0)["ov_rank90"] == 29, "flat spectrum: 90% of 32 equal values needs 29"


def test_duo_pattern_has_one_row_per_layer_and_column_per_kv_head(circuit_run) -> None:
    full = np.loadtxt(circuit_run.path / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    assert full.shape == (2, 2) and full.sum() == 2, "duo_share 0.5 of 4 key/value heads"
    kv = circuit_run.kv_heads.set_index(["layer", "kv_head"])
    kept = kv[kv["full_attention"] == 1]["retrieval"].min()
    assert kept >= kv[kv["full_attention"] == 0]["retrieval"].max()
    pattern = headpattern.read(circuit_run.path)  # the run directory is DuoAttention's pattern directory
    np.testing.assert_array_equal(pattern.scores, full)
    assert (pattern.sink_size, pattern.recent_size) == (circuit_run.meta["sinks"], circuit_run.meta["recent"])
    assert json.loads((circuit_run.path / "config.json").read_text()) == {"sink_size": pattern.sink_size,
                                                                         "recent_size": pattern.recent_size}


def test_an_encoder_has_no_induction_score_and_says_why(bert_dir, text_file, tmp_path) -> None:
    said = []
    run = spectra.heads(str(bert_dir), str(text_file), length=16, samples=2, out=tmp_path / "bert", progress=None,
                        notify=said.append)
    assert [line for line in said if "--recent" in line] == [
        "warning: at a length of 16 a streaming head keeping the first 4 and the 64 nearest keys (the default "
        "--recent) keeps every key: every retrieval score is 0 and full_attention_heads.tsv ranks nothing; pass "
        "--recent 11 or less"], "the default recent window is said, once the run goes ahead"
    assert run.diagnosis["retrieval"].abs().max() < 1e-6, "nothing dropped: no output change but rounding"
    assert run.diagnosis["induction_score"].isna().all()
    assert run.meta["induction"].startswith("not measured: an encoder")
    assert np.isfinite(run.diagnosis[["sink_share", "prev", "retrieval", "qk_rank90"]].to_numpy()).all()


def test_the_method_map_joins_an_approx_run(roberta_dir, text_file, tmp_path) -> None:
    approx = spectra.approx(str(roberta_dir), str(text_file), length=16, samples=2, budget=[4, 8],
                            methods="window,pool-mean,jl", out=tmp_path / "approx", progress=None,
                            notify=lambda line: None)
    run = spectra.heads(str(roberta_dir), str(text_file), length=16, samples=2, approx=approx.path,
                        out=tmp_path / "heads", progress=None, notify=lambda line: None)
    errors = approx.head_stats[approx.head_stats["metric"] == "out_err"]
    for row in run.method_map.itertuples(index=False):
        cell = errors[(errors["budget"] == row.budget) & (errors["layer"] == row.layer) & (errors["head"] == row.head)]
        assert row.winner == cell.loc[cell["mean"].idxmin(), "method"]
        assert row.winner_err == cell["mean"].min()
    assert sorted(run.rules["budget"]) == [4, 8] and run.rules["held_out_accuracy"].between(0, 1).all()


@pytest.mark.parametrize("args, message", [
    (["--eps", "1.5"], "eps must be an attention share in (0, 1), got 1.5"),
    (["--window", "0"], "window must be a number of tokens ≥ 1, got 0"),
    (["--duo-share", "2"], "duo-share must be a share of heads in [0, 1], got 2.0"),
    (["--at", "99"], "at must be an index in 1…16"),
    (["--recent", "1000"], "--recent 1000 with --sinks 4 leaves a streaming head nothing to drop at --length 16"),
    (["--recent", "12"], "so the retrieval score would measure nothing; give --recent 11 or less"),
    (["--sinks", "15", "--recent", "1"], "give fewer --sinks than 15"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, bert_dir, text_file, tmp_path, monkeypatch, capsys) -> None:
    code, out, err = tiny.run_cli(["heads", str(bert_dir), "--data", str(text_file), "--length", "16",
                                   "--out", str(tmp_path / "never"), *args], monkeypatch, capsys)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "never").exists()


def test_the_recent_window_is_checked_against_the_length(monkeypatch) -> None:
    """Issue 41, defect 9: a recent window that keeps every key made a long run measure nothing. A given one is refused
    (before the model loads: `resolve` runs first); the default stays 64 at every length (short runs keep their
    tables) and a run says when it keeps every key."""
    from spectra.reporter import Reporter

    assert HeadsOptions(recent=11).resolved(16).recent == 11 and HeadsOptions(sinks=0, recent=15).resolved(16).recent == 15
    with pytest.raises(SpectraError, match="recent=12 with sinks=4 leaves a streaming head nothing to drop at length=16"):
        HeadsOptions(recent=12).resolved(16)
    assert HeadsOptions().resolved(16).recent == HeadsOptions().resolved(4096).recent == 64
    said = []
    heads = REGISTRY["heads"]
    heads.warn_recent(RunConfig("m", "d", length=48), HeadsOptions().resolved(48), Reporter(None, said.append))
    assert said == ["warning: at a length of 48 a streaming head keeping the first 4 and the 64 nearest keys (the "
                    "default --recent) keeps every key: every retrieval score is 0 and full_attention_heads.tsv ranks "
                    "nothing; pass --recent 43 or less"]
    heads.warn_recent(RunConfig("m", "d", length=128), HeadsOptions().resolved(128), Reporter(None, said.append))
    assert len(said) == 1


def test_an_approx_run_of_another_model_is_refused_before_loading(tmp_path) -> None:
    run = tmp_path / "approx"
    run.mkdir()
    (run / "run.json").write_text('{"kind": "approx", "model": {"name": "other", "layers": 3, "heads": 4}}')
    (run / "heads.csv").write_text("method,budget,layer,head,metric,mean\n")
    with pytest.raises(SpectraError, match="is a run of other with 3 layers, but MiniLM has 6"):
        REGISTRY["heads"].check(RunConfig("m", "d", length=16), HeadsOptions(approx=run), Shape(6, 12, 512, False,
                                                                                               "MiniLM"))
    with pytest.raises(SpectraError, match="holds a run of 'spectra approx'; this needs a run of 'spectra heads'"):
        spectra.load_run(run, "heads")


def test_the_printed_diagnosis_and_rules_fit_an_80_column_terminal(roberta_dir, text_file, tmp_path, monkeypatch,
                                                                   capsys) -> None:
    """`spectra heads --all` prints within 80 columns: the 15-column diagnosis folds into parts that repeat layer and
    head, and a winner rule (a decision tree) prints one branch a line, indented, not as one flattened line."""
    import dataclasses

    from spectra.report import console

    approx = spectra.approx(str(roberta_dir), str(text_file), length=16, samples=2, budget=[4], methods="window,jl",
                            out=tmp_path / "approx", progress=None, notify=lambda line: None)
    run = spectra.heads(str(roberta_dir), str(text_file), length=16, samples=2, approx=approx.path,
                        out=tmp_path / "heads", progress=None, notify=lambda line: None)
    tree = ["sink_share < 0.25:", "  prev < 0.5:", "    → window", "  prev ≥ 0.5:", "    → jl", "sink_share ≥ 0.25:",
            "  → window"]
    rules = run.rules.assign(rule=" | ".join(tree))
    monkeypatch.setattr(console, "out", console._Console(width=80))
    REGISTRY["heads"].show(dataclasses.replace(run, rules=rules), every=True)
    out = capsys.readouterr().out
    lines = [line.rstrip() for line in out.splitlines()]
    assert max(len(line) for line in lines) <= 80
    tables = [line for line in lines if line.startswith("┃ layer ┃ head ┃")]
    assert len(tables) > 1, "the diagnosis folds into parts, each naming layer and head"
    start = next(i for i, line in enumerate(lines) if line.startswith("k = 4: winner rule"))
    assert [line[2:] for line in lines[start + 1:start + 1 + len(tree)]] == tree
