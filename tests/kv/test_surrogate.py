"""KVzap's surrogate fit against independent computations: the ridge regression recovers a known linear map and equals
numpy's least squares of the ridge-augmented system; the MLP is deterministic under its seed and fits a nonlinear
map; `quality` equals numpy's R² and scipy's Spearman; and end to end on a tiny Llama, `spectra artifacts kvzap`
writes the ridge fit of hidden states read here by transformers (output_hidden_states through each layer's
input_layernorm) to the log of KVzip's scores, in kvpress's format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from spectra.errors import SpectraError
from spectra.kv import artifacts, prefill, reconstruction, surrogate
from spectra import api
from spectra.kv.artifactfit import ArtifactRequest, text_blocks
from spectra.kv.presses.kvzap import surrogate_scores


def synthetic(rows: int = 300, dim: int = 6, heads: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, dim)) * rng.uniform(0.5, 3, dim) + rng.standard_normal(dim)
    mapping, offset = rng.standard_normal((heads, dim)), rng.standard_normal(heads)
    return x, mapping, offset


def test_ridge_recovers_a_known_linear_map() -> None:
    x, mapping, offset = synthetic()
    weight, bias = surrogate.ridge(torch.from_numpy(x), torch.from_numpy(x @ mapping.T + offset), strength=1e-14)
    np.testing.assert_allclose(weight.numpy(), mapping, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(bias.numpy(), offset, rtol=1e-8, atol=1e-8)


def test_ridge_is_least_squares_of_the_augmented_system() -> None:
    """min ‖Xc w − yc‖² + λ‖w‖² is the least-squares solution of [Xc; √λ I] w = [yc; 0] (numpy's lstsq), λ relative
    to tr(XcᵀXc)/D, the intercept unpenalised."""
    x, mapping, offset = synthetic(seed=1)
    y = x @ mapping.T + offset + np.random.default_rng(2).standard_normal((len(x), 2))
    centred = x - x.mean(axis=0)
    penalty = surrogate.RIDGE * np.trace(centred.T @ centred) / x.shape[1]
    system = np.vstack([centred, np.sqrt(penalty) * np.eye(x.shape[1])])
    wanted = np.vstack([y - y.mean(axis=0), np.zeros((x.shape[1], 2))])
    expected = np.linalg.lstsq(system, wanted, rcond=None)[0].T
    weight, bias = surrogate.ridge(torch.from_numpy(x), torch.from_numpy(y))
    np.testing.assert_allclose(weight.numpy(), expected, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(bias.numpy(), y.mean(axis=0) - x.mean(axis=0) @ expected.T, rtol=1e-9, atol=1e-10)


def test_the_mlp_is_deterministic_under_its_seed_and_fits_a_nonlinear_map() -> None:
    x, mapping, _ = synthetic(rows=400, seed=3)
    y = torch.from_numpy(np.tanh(x @ mapping.T) + 0.5 * (x[:, :2] ** 2))
    x = torch.from_numpy(x)
    first, again = surrogate.mlp(x, y, width=16, seed=4), surrogate.mlp(x, y, width=16, seed=4)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["0.weight"], surrogate.mlp(x, y, width=16, steps=20, seed=5)["0.weight"])
    assert {name: tuple(t.shape) for name, t in first.items()} == {"0.weight": (16, 6), "0.bias": (16,),
                                                                   "2.weight": (2, 16), "2.bias": (2,)}
    predicted = surrogate_scores({f"layers.0.{name}": t for name, t in first.items()}, 0, x.float()).double()
    r2 = 1 - ((predicted - y) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)  # the standardisation folded in
    free = surrogate.mlp(x, y, width=16, seed=4, decay=0.0)  # the penalty shrinks the weights
    assert first["0.weight"].norm() < free["0.weight"].norm() and first["2.weight"].norm() < free["2.weight"].norm()
    weight, bias = surrogate.ridge(x, y)  # a linear map cannot fit it
    linear = 1 - ((x @ weight.T + bias - y) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)
    assert (r2 > 0.9).all() and (linear < 0.2).all(), (r2, linear)


def test_quality_is_r2_of_log_scores_and_spearman_of_scores() -> None:
    rng = np.random.default_rng(6)
    states = torch.from_numpy(rng.standard_normal((2, 50, 4)).astype(np.float32))
    scores = torch.from_numpy(rng.uniform(1e-4, 1, (2, 50, 3)).astype(np.float32))
    weights = {f"layers.{layer}.{name}": torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
               for layer in range(2) for name, shape in (("weight", (3, 4)), ("bias", (3,)))}
    table = surrogate.quality(weights, states, scores)
    assert list(table.columns) == ["layer", "kv_head", "r2", "spearman"] and len(table) == 6
    for row in table.itertuples():
        w, b = (weights[f"layers.{row.layer}.{name}"].double().numpy() for name in ("weight", "bias"))
        predicted = states[row.layer].double().numpy() @ w[row.kv_head] + b[row.kv_head]
        target = np.log(scores[row.layer, :, row.kv_head].double().numpy())
        r2 = 1 - ((predicted - target) ** 2).sum() / ((target - target.mean()) ** 2).sum()
        assert row.r2 == pytest.approx(r2, rel=1e-5)
        assert row.spearman == pytest.approx(spearmanr(predicted, target).statistic, abs=1e-9)


def test_an_unknown_surrogate_is_refused(text_file: Path, tmp_path: Path) -> None:
    with pytest.raises(SpectraError, match="surrogate must be one of linear, mlp .* got 'cubic'"):
        api.artifacts("kvzap", "/nonexistent/model", data=[text_file], out=tmp_path / "z", surrogate="cubic")


def test_the_rows_are_the_sinks_and_the_reconstructed_positions() -> None:
    assert surrogate.scored_rows(10, 6).tolist() == [0, 1, 2, 3, 6, 7, 8, 9]  # 4, 5: the opening, never measured
    assert surrogate.scored_rows(6, 0).tolist() == list(range(6))


def test_end_to_end_on_a_tiny_llama(llama_dir: Path, text_file: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from spectra import models

    length, samples = 24, 2
    written = api.artifacts("kvzap", str(llama_dir), data=[text_file], out=tmp_path / "zap", length=length,
                            samples=samples, surrogate="linear")
    loaded = models.load(str(llama_dir), device="cpu")
    request = ArtifactRequest("kvzap", str(llama_dir), (text_file,), tmp_path / "zap", length, samples, None, None,
                              False, "linear")
    blocks = text_blocks(loaded.tokenizer, request)
    repetition = reconstruction.Repetition.of(loaded.tokenizer)
    rows = surrogate.scored_rows(length, repetition.prefix)
    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()  # the hidden states read by transformers alone
    states, scores = [], []
    for index, ids in enumerate(blocks):
        with torch.no_grad():
            residual = model(ids[None], output_hidden_states=True).hidden_states
            states.append(torch.stack([layer.input_layernorm(residual[i][0])[rows]
                                       for i, layer in enumerate(model.model.layers)]))
            found = prefill.exact(loaded.model, loaded.layers, ids, 0, index, ())
            keys, values = [part.key for part in found], [part.value for part in found]
            kvzip = reconstruction.scores(loaded.model, loaded.layers, keys, values, ids, repetition, index)
        scores.append(kvzip[:, :, rows].transpose(1, 2))
    states, scores = torch.cat(states, dim=1), torch.cat(scores, dim=1)
    config = json.loads((written / artifacts.CONFIG_FILE).read_text())
    assert config["model_type"] == "kvzap" and config["hidden_dim"] is None
    assert (config["n_modules"], config["input_dim"], config["output_dim"]) == (2, 32, 2)
    tensors = artifacts.load("kvzap", written)
    for layer in range(2):
        weight, bias = surrogate.ridge(states[layer], surrogate.targets(scores[layer]))
        torch.testing.assert_close(tensors[f"layers.{layer}.weight"], weight.float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(tensors[f"layers.{layer}.bias"], bias.float(), rtol=1e-4, atol=1e-4)
    mlp = api.artifacts("kvzap", str(llama_dir), data=[text_file], out=tmp_path / "mlp", length=length,
                        samples=samples)
    assert artifacts.SURROGATE.shape(mlp) == {"layers": 2, "hidden": 32, "kv_heads": 2}
    assert json.loads((mlp / artifacts.CONFIG_FILE).read_text())["hidden_dim"] == surrogate.WIDTH


def test_the_cli_refuses_an_unknown_surrogate_in_one_line(text_file, tmp_path, monkeypatch, capsys) -> None:
    import tiny

    code, _, stderr = tiny.run_cli(["artifacts", "kvzap", "/nonexistent/model", "--data", str(text_file), "--out",
                                    str(tmp_path / "zap"), "--surrogate", "cubic"], monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert "--surrogate must be one of linear, mlp (kvzap's surrogate), got 'cubic'" in stderr
    assert not (tmp_path / "zap").exists()


def test_blocks_no_longer_than_the_chat_templates_opening_are_refused(text_file: Path, tmp_path: Path) -> None:
    import task_files
    from transformers import AutoTokenizer

    chat = task_files.save_chat_decoder(tmp_path / "tiny-chat")
    prefix = reconstruction.Repetition.of(AutoTokenizer.from_pretrained(chat)).prefix
    assert prefix + reconstruction.SINKS >= 8  # beyond check_request's least length, so this check is the one
    with pytest.raises(SpectraError, match=f"length {prefix + 4} leaves too few tokens after the {prefix} of "
                                           f".*give at least {prefix + 5}"):
        api.artifacts("kvzap", str(chat), data=[text_file], out=tmp_path / "zap", length=prefix + 4, samples=1)
    assert not (tmp_path / "zap").exists()
