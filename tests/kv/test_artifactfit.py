"""`spectra artifacts`' fits against independent computations: the Q-Filters are numpy's top right singular vector
of the post-RoPE queries of each key/value group (oriented against their mean), the query statistics numpy's mean
and covariance (ddof 1) of the pre-RoPE queries after the sinks — first on random queries, then end to end on a tiny
Llama whose queries are read here by a hook on q_proj and rotated by transformers' own `apply_rotary_pos_emb`; and
the requests refused before any model loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv import artifacts
from spectra import api
from spectra.kv.artifactfit import QFilterFit, StatisticsFit
from spectra.kv.presses.expected import SINKS


def numpy_filter(queries: np.ndarray) -> np.ndarray:
    """(d,) the top right singular vector of `queries` (N, d), signed so that the mean query projects negatively."""
    top = np.linalg.svd(queries, full_matrices=False)[2][0]
    return -top if queries.mean(axis=0) @ top > 0 else top


def test_the_filter_is_the_top_right_singular_vector_against_the_mean_query() -> None:
    rng = np.random.default_rng(0)
    heads, kv_heads, dim = 4, 2, 6
    blocks = [rng.standard_normal((heads, 20, dim)) + rng.standard_normal(dim) * 2 for _ in range(3)]
    fit = QFilterFit(1, kv_heads, dim)
    for block in blocks:
        fit.update(0, torch.from_numpy(block))
    got = fit.result()["q_filters"][0].double().numpy()
    for head in range(kv_heads):  # the group's query heads 2h, 2h + 1, every block's positions stacked
        stacked = np.concatenate([block[2 * head:2 * head + 2].reshape(-1, dim) for block in blocks])
        np.testing.assert_allclose(got[head], numpy_filter(stacked), atol=1e-6)
        assert stacked.mean(axis=0) @ got[head] < 0


def test_the_statistics_are_the_mean_and_covariance_after_the_sinks() -> None:
    rng = np.random.default_rng(1)
    blocks = [rng.standard_normal((3, 15, 5)) * 2 + 1 for _ in range(2)]
    fit = StatisticsFit(2, 3, 5)
    for block in blocks:
        for layer in range(2):
            fit.update(layer, torch.from_numpy(block * (layer + 1)))
    got = fit.result()
    for layer in range(2):
        for head in range(3):
            queries = np.concatenate([block[head, SINKS:] * (layer + 1) for block in blocks])
            np.testing.assert_allclose(got["query_mean"][layer, head].numpy(), queries.mean(axis=0), rtol=1e-6)
            np.testing.assert_allclose(got["query_cov"][layer, head].numpy(), np.cov(queries.T, ddof=1),
                                       rtol=1e-5, atol=1e-6)


def model_queries(folder: Path, blocks: list[list[int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per block, every layer's queries (layers, H, n, d) before and after RoPE, read by a hook on q_proj and rotated
    by transformers' `apply_rotary_pos_emb` (independently of spectra's prefill)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    heads, dim = model.config.num_attention_heads, model.config.hidden_size // model.config.num_attention_heads
    pre_all, post_all = [], []
    for ids in blocks:
        seen: list[torch.Tensor] = []
        hooks = [layer.self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
                 for layer in model.model.layers]
        with torch.no_grad():
            model(torch.tensor([ids]))
            cos, sin = model.model.rotary_emb(seen[0], torch.arange(len(ids))[None])
        for hook in hooks:
            hook.remove()
        pre = torch.stack([out[0].view(len(ids), heads, dim).transpose(0, 1) for out in seen])
        post = apply_rotary_pos_emb(pre, pre, cos, sin, unsqueeze_dim=0)[0]
        pre_all.append(pre.double().numpy())
        post_all.append(post.double().numpy())
    return pre_all, post_all


def test_end_to_end_on_a_tiny_llama(llama_dir: Path, text_file: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(llama_dir).encode(text_file.read_text(), add_special_tokens=False)
    length, samples = 24, 3
    blocks = [tokens[i * length:(i + 1) * length] for i in range(samples)]
    pre, post = model_queries(llama_dir, blocks)
    layers, heads, _, dim = pre[0].shape
    written = api.artifacts("qfilter", str(llama_dir), data=[text_file], out=tmp_path / "qf", length=length,
                            samples=samples)
    config = json.loads((written / artifacts.CONFIG_FILE).read_text())
    assert config == {"num_layers": layers, "num_kv_heads": 2, "kv_head_dim": dim}
    fitted = json.loads((written / artifacts.META_FILE).read_text())  # what it was fitted on, by sha256
    assert fitted["data"] == {"files": [{"name": text_file.name, "bytes": text_file.stat().st_size,
                                         "sha256": hashlib.sha256(text_file.read_bytes()).hexdigest()}],
                              "length": length, "blocks": samples}
    assert fitted["model"]["weights"] == {"model.safetensors": hashlib.sha256(
        (llama_dir / "model.safetensors").read_bytes()).hexdigest()}
    assert fitted["artifact"] == "qfilter" and "torch" in fitted["versions"]
    filters = artifacts.load("qfilter", written)["q_filters"].double().numpy()
    groups = heads // 2
    for layer in range(layers):
        for head in range(2):
            stacked = np.concatenate([block[layer, head * groups:(head + 1) * groups].reshape(-1, dim)
                                      for block in post])
            np.testing.assert_allclose(filters[layer, head], numpy_filter(stacked), atol=1e-4)
    stats = api.artifacts("expected_attention_stats", str(llama_dir), data=[text_file], out=tmp_path / "st",
                          length=length, samples=samples)
    found = artifacts.load("expected_attention_stats", stats)
    assert json.loads((stats / artifacts.CONFIG_FILE).read_text())["n_sink"] == SINKS
    for layer in range(layers):
        for head in range(heads):
            queries = np.concatenate([block[layer, head, SINKS:] for block in pre])
            np.testing.assert_allclose(found["query_mean"][layer, head].numpy(), queries.mean(axis=0), atol=1e-5)
            np.testing.assert_allclose(found["query_cov"][layer, head].numpy(), np.cov(queries.T), atol=1e-5)


def test_bad_requests_are_refused_before_the_model_loads(text_file: Path, tmp_path: Path) -> None:
    nowhere = "/nonexistent/model"  # never reached: each request fails first
    latin = tmp_path / "latin1.txt"  # issue 55, item 5: read with replacement characters and fitted on before
    latin.write_bytes("first line\ncafé au lait\n".encode("latin-1"))
    cases = [("qfilters", [text_file], tmp_path / "a", 16, 2, "unknown artifact 'qfilters'"),
             ("qfilter", [tmp_path / "missing.txt"], tmp_path / "a", 16, 2, "no such file"),
             ("qfilter", [], tmp_path / "a", 16, 2, "names no file"),
             ("expected_attention_stats", [text_file], tmp_path / "a", SINKS + 1, 2, f"≥ {SINKS + 2} tokens"),
             ("qfilter", [text_file], tmp_path / "a", 16, 0, "must be ≥ 1"),
             ("qfilter", [text_file], text_file, 16, 2, "is a file"),
             ("qfilter", [latin], tmp_path / "a", 16, 2, r"latin1.txt is not UTF-8 text \(byte 0xe9 on line 2\); "
                                                        "convert it")]
    for kind, data, out, length, samples, message in cases:
        with pytest.raises(SpectraError, match=message):
            api.artifacts(kind, nowhere, data=data, out=out, length=length, samples=samples)
    (tmp_path / "taken").mkdir()
    with pytest.raises(SpectraError, match="already exists"):
        api.artifacts("qfilter", nowhere, data=[text_file], out=tmp_path / "taken")


def test_text_of_fewer_blocks_than_asked_is_fitted_on_and_said(llama_dir: Path, text_file: Path, tmp_path: Path,
                                                               monkeypatch, capsys) -> None:
    """Issue 55, item 5: --samples 16 on text of one block wrote an artifact fitted on one, without a word. As analyze
    says of a corpus that yields fewer sequences, one notice line says how many blocks the text gives of those asked
    for and how to get more, and the fit goes on (num_samples records them); text too short for one block is refused
    with the tokenizer alone, before the weights load."""
    from transformers import AutoTokenizer

    from spectra import models

    from ..tiny import run_cli

    short = tmp_path / "short.txt"  # the tiny Llama embeds 128 positions
    short.write_text(" ".join(text_file.read_text().split()[:40]))
    tokens = len(AutoTokenizer.from_pretrained(llama_dir).encode(short.read_text(), add_special_tokens=False))
    length = tokens // 3  # three blocks, whatever the tokenizer makes of the text
    assert 8 < length and tokens < 127, tokens
    text_file = short
    notices: list[str] = []
    written = api.artifacts("expected_attention_stats", str(llama_dir), data=[text_file], out=tmp_path / "st",
                            length=length, samples=16, notify=notices.append)
    assert json.loads((written / artifacts.CONFIG_FILE).read_text())["num_samples"] == 3
    assert notices == [f"the text yields 3 blocks of {length} tokens of the 16 asked for ({tokens} tokens in all); the "
                       "artifact is fitted on them (more text or a smaller --length gives more blocks, a smaller "
                       "--samples asks for fewer)"]
    argv = ["artifacts", "qfilter", str(llama_dir), "--data", str(text_file), "--length", str(length), "--samples",
            "3", "--out", str(tmp_path / "qf")]
    code, _, stderr = run_cli(argv, monkeypatch, capsys)
    assert code == 0 and stderr == "", stderr  # as many as asked for: nothing to say
    argv[argv.index("3")] = "4"
    code, _, stderr = run_cli([*argv, "--overwrite"], monkeypatch, capsys)
    assert code == 0 and stderr.startswith(f"the text yields 3 blocks of {length} tokens of the 4 asked for"), stderr
    assert stderr.count("\n") == 1
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model loaded"))
    code, _, stderr = run_cli(["artifacts", "qfilter", str(llama_dir), "--data", str(text_file), "--length",
                               str(tokens + 1), "--out", str(tmp_path / "none")], monkeypatch, capsys)
    assert code == 2 and stderr == (f"error: --data holds no block of {tokens + 1} tokens (it holds {tokens}); give "
                                    "longer text or a smaller --length\n"), stderr
    assert not (tmp_path / "none").exists()


def test_the_command_has_its_python_function(llama_dir: Path, text_file: Path, tmp_path: Path) -> None:
    """Issue 54/55: `spectra artifacts` was the one command without a Python function. `spectra.artifacts` is the
    command's own function; --data's comma-separated string, one path or a list of them are alike."""
    import spectra

    assert spectra.artifacts is api.artifacts and "artifacts" in dir(spectra)
    runs = {"string": str(text_file), "path": text_file, "list": [str(text_file)]}
    found = {name: spectra.artifacts("qfilter", str(llama_dir), data=data, out=tmp_path / name, length=24, samples=2)
             for name, data in runs.items()}
    assert all(path == tmp_path / name for name, path in found.items())
    filters = [artifacts.load("qfilter", path)["q_filters"] for path in found.values()]
    assert all(torch.equal(filters[0], other) for other in filters[1:])
    with pytest.raises(SpectraError, match="has an empty item"):
        spectra.artifacts("qfilter", str(llama_dir), data=f"{text_file},,{text_file}", out=tmp_path / "x")
