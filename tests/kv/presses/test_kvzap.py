"""`kvzap(DIR)` against numpy: kvpress 0.5.5's KVzapPress score, `layers[ℓ](hidden_states)` transposed, of a linear
or Linear–GELU–Linear surrogate, on random hidden states; the rows it keeps; the directory it reads (written here by
hand in the layout kvpress's `KVzapModel.save_pretrained` writes) and what it refuses."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from scipy.special import erf

from spectra.errors import SpectraError
from spectra.kv import artifacts
from spectra.kv.presses import REGISTRY, n_kept
from spectra.registry import PRESSES

from .conftest import KV_HEADS, make_prefill

LAYERS, HIDDEN, WIDTH = 3, 12, 5


def write_surrogate(folder, width: int | None, layers: int = LAYERS, dim: int = HIDDEN, heads: int = KV_HEADS,
                    seed: int = 0, **config) -> tuple[str, dict[str, np.ndarray]]:
    """A surrogate directory as kvpress's KVzapModel.save_pretrained lays it out, written with safetensors alone."""
    rng = np.random.default_rng(seed)
    parts = ({"weight": (heads, dim), "bias": (heads,)} if width is None else
             {"0.weight": (width, dim), "0.bias": (width,), "2.weight": (heads, width), "2.bias": (heads,)})
    tensors = {f"layers.{i}.{part}": rng.standard_normal(shape).astype(np.float32)
               for i in range(layers) for part, shape in parts.items()}
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["KVzapModel"], "model_type": "kvzap", "input_dim": dim, "output_dim": heads,
        "n_modules": layers, "hidden_dim": width, **config}))
    return str(folder), tensors


def numpy_scores(tensors: dict[str, np.ndarray], layer: int, hidden: np.ndarray) -> np.ndarray:
    """(H_kv, L): the surrogate of `layer` on hidden (L, D), in float64, GELU as x·Φ(x)."""
    get = lambda name: tensors[f"layers.{layer}.{name}"].astype(np.float64)  # noqa: E731
    if f"layers.{layer}.weight" in tensors:
        return (hidden @ get("weight").T + get("bias")).T
    inner = hidden @ get("0.weight").T + get("0.bias")
    inner = inner * 0.5 * (1 + erf(inner / np.sqrt(2)))
    return (inner @ get("2.weight").T + get("2.bias")).T


def with_hidden(layer: int, length: int = 80, dim: int = HIDDEN, seed: int = 0):
    prefill, _ = make_prefill(length=length, seed=seed)
    hidden = np.random.default_rng(100 + seed).standard_normal((length, dim))
    return replace(prefill, layer=layer, passes={"hidden": torch.from_numpy(hidden)}), hidden


@pytest.mark.parametrize("width", [None, WIDTH])
def test_scores_are_the_layers_surrogate_of_the_hidden_states(tmp_path, width) -> None:
    folder, tensors = write_surrogate(tmp_path / "zap", width)
    press = REGISTRY["kvzap"].bind(folder)
    assert press.name == f"kvzap({folder})" and press.peer == "KVzapPress"
    for layer in range(LAYERS):
        prefill, hidden = with_hidden(layer, seed=layer)
        expected = numpy_scores(tensors, layer, hidden)
        got = press.score(prefill, 0.5)
        assert got.shape == (KV_HEADS, 80) and got.dtype == torch.float64, "scored in the hidden states' dtype"
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)  # weights stored in float32
        for ratio in (0.25, 0.5, 0.9):
            kept = press.compress(prefill, ratio).kept.numpy()
            top = np.argsort(-expected, axis=-1, kind="stable")[:, :n_kept(80, ratio)]
            np.testing.assert_array_equal(kept, np.sort(top))


def test_it_declares_reading_the_hidden_states(tmp_path) -> None:
    folder, _ = write_surrogate(tmp_path / "zap", None)
    assert PRESSES.facts(f"kvzap({folder})")["reads"] == ("hidden",) and not PRESSES.facts("snapkv").get("hidden")
    assert f"kvzap({folder})" in PRESSES.having("hidden")
    prefill, _ = make_prefill()
    with pytest.raises(ValueError, match="lacks 'hidden' \\(each layer's attention input"):
        REGISTRY["kvzap"].bind(folder).score(prefill, 0.5)


def test_surrogates_of_another_shape_are_refused(tmp_path) -> None:
    folder, _ = write_surrogate(tmp_path / "zap", WIDTH)
    with pytest.raises(SpectraError, match="9 hidden dimensions"):
        REGISTRY["kvzap"].bind(folder).score(with_hidden(0, dim=9)[0], 0.5)
    with pytest.raises(SpectraError, match="3 layers"):
        REGISTRY["kvzap"].bind(folder).score(with_hidden(3)[0], 0.5)
    for model, what in (({"layers": 30}, "30 layers"), ({"kv_heads": 3}, "3 key/value heads"),
                        ({"hidden": 576}, "576 hidden dimensions")):
        with pytest.raises(SpectraError, match=f"but the model has {what}; fit them .*spectra artifacts kvzap"):
            artifacts.fits("kvzap", folder, "the model", **model)
    artifacts.fits("kvzap", folder, "the model", layers=LAYERS, kv_heads=KV_HEADS, hidden=HIDDEN, head_dim=64)


def test_a_directory_that_is_no_surrogate_is_refused_in_one_line(tmp_path) -> None:
    wrong_type, _ = write_surrogate(tmp_path / "type", None, model_type="qfilter")
    with pytest.raises(SpectraError, match="model_type is 'qfilter', not 'kvzap'"):
        artifacts.check_surrogate(wrong_type)
    no_dim, _ = write_surrogate(tmp_path / "dim", None, input_dim="wide")
    with pytest.raises(SpectraError, match="input_dim is 'wide', not a positive integer"):
        artifacts.check_surrogate(no_dim)
    fewer, _ = write_surrogate(tmp_path / "fewer", None, n_modules=4)  # config says 4 layers, the file holds 3
    with pytest.raises(SpectraError, match="holds no tensor 'layers.3.weight'"):
        artifacts.check_surrogate(fewer)
    linear, _ = write_surrogate(tmp_path / "mlp", None, hidden_dim=WIDTH)  # a linear surrogate said to be an MLP
    with pytest.raises(SpectraError, match="holds no tensor 'layers.0.0.weight'"):
        artifacts.check_surrogate(linear)
    narrow, _ = write_surrogate(tmp_path / "narrow", None, input_dim=HIDDEN + 1)
    with pytest.raises(SpectraError, match="'layers.0.weight' is 2 × 12, but its config.json makes it 2 × 13"):
        artifacts.check_surrogate(narrow)
    with pytest.raises(SpectraError, match="no such directory"):
        artifacts.check_surrogate(str(tmp_path / "absent"))


def test_an_unbound_press_says_how_to_name_it() -> None:
    prefill, _ = with_hidden(0)
    with pytest.raises(ValueError, match=r"kvzap\(<directory>\)"):
        REGISTRY["kvzap"].score(prefill, 0.5)


@pytest.mark.parametrize("written", ["kvzap({})", "dms(kvzap({}),-6)", "kvpress:kvzap_linear({},-6)"])
def test_a_surrogate_of_another_model_is_refused_before_it_loads(llama_dir, text_file, tmp_path, monkeypatch,
                                                                 capsys, written) -> None:
    """The tiny Llama is 2 layers × 32 hidden dimensions × 2 key/value heads: its config.json refuses a surrogate
    of 12 hidden dimensions in one line, exit 2, before the model loads and before anything is written — named alone,
    inside a press wrapping it, or in a configuration of kvpress's registry."""
    import tiny
    from spectra import models

    folder, _ = write_surrogate(tmp_path / "zap", None, layers=2)
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model loaded"))
    code, _, stderr = tiny.run_cli(["cache", str(llama_dir), "--data", str(text_file), "--presses",
                                    written.format(folder), "--ratios", "0.5", "--out", str(tmp_path / "run")],
                                   monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert (f"KVzap surrogate {folder} is 2 layers × 12 hidden dimensions × 2 key/value heads, but tiny-llama has "
            "2 layers × 32 hidden dimensions × 2 key/value heads; fit them for this model with `spectra artifacts "
            "kvzap") in stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


def test_both_protocols_hand_the_press_the_hidden_states(llama_dir, text_file, tmp_path) -> None:
    """`spectra cache` with kvzap(DIR) on a tiny Llama, over text (the NLL protocol: the cache probe's hook on the
    attention input) and over a task file (the task protocol: the prefill asked for the hidden states): the press
    reads them (it refuses a prefill without), keeps max(1, int(L/2)) per head and changes the outcome."""
    import spectra
    import task_files

    folder, _ = write_surrogate(tmp_path / "zap", WIDTH, layers=2, dim=32)
    settings = dict(presses=f"kvzap({folder})", ratios=0.5, samples=1, progress=None, notify=lambda line: None)
    text = spectra.cache(str(llama_dir), str(text_file), context=80, continuation=8, out=tmp_path / "text",
                         **settings)
    rows = text.table.set_index("press")
    assert rows.loc[f"kvzap({folder})", "kept"] == n_kept(80, 0.5)  # rows kept per head
    assert rows.loc[f"kvzap({folder})", "nll"] != rows.loc["full", "nll"]
    file = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=1))
    chat = task_files.save_chat_decoder(tmp_path / "tiny-chat")
    run = spectra.cache(str(chat), str(file), out=tmp_path / "tasks", **settings)
    assert set(run.examples["press"]) == {"full", f"kvzap({folder})"}
