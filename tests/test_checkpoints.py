"""A model source told from its files: hub ids pass, local directories are checked and named."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from spectra import checkpoints
from spectra.errors import SpectraError


def test_hub_ids_are_labelled_by_their_last_part() -> None:
    found = checkpoints.inspect("FacebookAI/roberta-base")
    assert not found.local and found.label == "roberta-base" and found.where == "FacebookAI/roberta-base"


def test_a_saved_directory_is_checked_and_named_after_its_folder(roberta_dir) -> None:
    found = checkpoints.inspect(str(roberta_dir))
    assert found.local and found.label == "tiny-roberta" and found.config["model_type"] == "roberta"
    assert found.where == str(roberta_dir.resolve())


def test_a_generic_folder_is_named_after_its_config(roberta_dir, tmp_path) -> None:
    generic = tmp_path / "some-experiment" / "model"
    shutil.copytree(roberta_dir, generic)
    assert checkpoints.inspect(str(generic)).label == "roberta-some-experiment"
    config = json.loads((generic / "config.json").read_text())
    (generic / "config.json").write_text(json.dumps({**config, "_name_or_path": "org/MiniLM-L6"}))
    assert checkpoints.inspect(str(generic)).label == "MiniLM-L6"


@pytest.mark.parametrize("damage, message", [
    ("config", "has no config.json"),
    ("broken config", "config.json is not valid JSON"),
    ("no model_type", "has no model_type"),
    ("weights", "has a config.json but no weights"),
    ("tokenizer", "has no tokenizer files"),
])
def test_broken_directories_are_one_line(damage, message, roberta_dir, tmp_path) -> None:
    target = tmp_path / "tiny"
    shutil.copytree(roberta_dir, target)
    if damage == "config":
        (target / "config.json").unlink()
    elif damage == "broken config":
        (target / "config.json").write_text('{"model_type": ')
    elif damage == "no model_type":
        (target / "config.json").write_text("{}")
    elif damage == "weights":
        (target / "model.safetensors").unlink()
    else:
        for name in checkpoints.TOKENIZER_FILES:
            (target / name).unlink(missing_ok=True)
    with pytest.raises(SpectraError, match=message):
        checkpoints.inspect(str(target))


def test_missing_paths() -> None:
    with pytest.raises(SpectraError, match="model directory ./nowhere does not exist"):
        checkpoints.inspect("./nowhere")


def string(text: str) -> bytes:
    """A GGUF string: its length (u64) and its bytes."""
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path, fields: dict[str, object]) -> None:
    """A GGUF header holding `fields` (strings and u32 counts) and no tensor."""
    records = [string(key) + (struct.pack("<I", 8) + string(value) if isinstance(value, str)
                              else struct.pack("<II", 4, value)) for key, value in fields.items()]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(records)) + b"".join(records))


def test_gguf_header_fields_are_read_without_decoding_the_rest(tmp_path) -> None:
    records = [string("general.name") + struct.pack("<I", 8) + string("tiny"),
               string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + b"".join(map(string, "abc")),
               string("tokenizer.scores") + struct.pack("<IIQ", 9, 6, 3) + struct.pack("<3f", 1, 2, 3),
               string("general.file_type") + struct.pack("<II", 4, 3)]
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(records)) + b"".join(records))
    assert checkpoints.gguf_field(path, "general.file_type") == 3
    assert checkpoints.gguf_field(path, "general.name") == "tiny"
    assert checkpoints.gguf_field(path, "general.missing") is None
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04")
    assert checkpoints.gguf_field(tmp_path / "not.gguf", "general.file_type") is None


def test_the_shape_knows_the_key_value_heads_of_every_source(llama_dir, gpt2_dir, tmp_path) -> None:
    """The key/value heads come with the shape, whatever the source: a config.json's num_key_value_heads (grouped
    queries), its query heads when it names none (GPT-2's n_head), a GGUF header's head_count_kv (its head_count
    when absent), and nothing for a hub id before it loads (the loaded model's shape tells them then)."""
    assert checkpoints.inspect(str(llama_dir)).shape().kv_heads == 2  # tiny Llama: 4 query heads share 2
    assert checkpoints.inspect(str(gpt2_dir)).shape().kv_heads == checkpoints.inspect(str(gpt2_dir)).shape().heads == 4
    assert checkpoints.config_shape({"num_attention_heads": 8, "num_key_value_heads": 1}, "mqa").kv_heads == 1
    assert checkpoints.inspect("org/some-model").shape().kv_heads is None
    grouped = {"general.architecture": "llama", "llama.block_count": 30, "llama.attention.head_count": 9,
               "llama.attention.head_count_kv": 3, "llama.context_length": 8192}
    write_gguf(tmp_path / "grouped.gguf", grouped)
    shape = checkpoints.Source("x", tmp_path, {}, "grouped", "grouped.gguf").shape()
    assert (shape.layers, shape.heads, shape.kv_heads, shape.positions, shape.causal) == (30, 9, 3, 8192, True)
    write_gguf(tmp_path / "plain.gguf", {key: value for key, value in grouped.items() if "_kv" not in key})
    assert checkpoints.Source("x", tmp_path, {}, "plain", "plain.gguf").shape().kv_heads == 9


def test_the_shape_knows_the_hidden_size(llama_dir, gpt2_dir, tmp_path) -> None:
    """kvzap(DIR)'s surrogate reads D hidden dimensions: a config.json's hidden_size (GPT-2's n_embd), a GGUF
    header's embedding_length, nothing for a hub id before it loads."""
    assert checkpoints.inspect(str(llama_dir)).shape().hidden == 32
    assert checkpoints.inspect(str(gpt2_dir)).shape().hidden == 32
    assert checkpoints.inspect("org/some-model").shape().hidden is None
    write_gguf(tmp_path / "wide.gguf", {"general.architecture": "llama", "llama.embedding_length": 576})
    assert checkpoints.Source("x", tmp_path, {}, "wide", "wide.gguf").shape().hidden == 576


def test_the_weights_sha256_is_a_gguf_files_or_a_folders_weight_files(tiny_gguf, roberta_dir, monkeypatch) -> None:
    """run.json's `model.weights`: a GGUF file hashed once per process (the model cache hashed it first), a local
    folder's weight files and nothing else, none for a hub id."""
    import hashlib

    from spectra import gguffile, modelcache

    hashed = []
    digest = gguffile.digest
    monkeypatch.setattr(gguffile, "digest", lambda path: hashed.append(path) or digest(path))
    monkeypatch.setattr(gguffile, "_HASHES", {})
    modelcache.entry(tiny_gguf)
    assert checkpoints.weights_sha256(str(tiny_gguf)) == {tiny_gguf.name: hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()}
    assert hashed == [tiny_gguf], "the model cache's hash is reused, not computed again"
    found = checkpoints.weights_sha256(str(roberta_dir))
    assert found == {name: hashlib.sha256((roberta_dir / name).read_bytes()).hexdigest()
                     for name in ("model.safetensors",)}
    assert checkpoints.weights_sha256("FacebookAI/roberta-base") is None


def test_the_shape_knows_whether_some_layers_attend_through_a_sliding_window(llama_dir, tmp_path) -> None:
    """`--local-layers` is refused before the model loads on a model without sliding-window layers: a config.json's
    layer_types (or a window for every layer, Mistral's), a GGUF header's attention.sliding_window (Gemma's configs
    default to a window: a Gemma header without one does not tell), nothing for a hub id."""
    assert checkpoints.inspect(str(llama_dir)).shape().windowed is False
    gemma = {"num_hidden_layers": 2, "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"]}
    assert checkpoints.config_shape(gemma, "gemma").windowed is True
    assert checkpoints.config_shape({"num_hidden_layers": 2, "sliding_window": 4096}, "mistral").windowed is True
    assert checkpoints.config_shape({"num_hidden_layers": 2, "sliding_window": 4096, "use_sliding_window": False},
                                    "qwen2").windowed is False
    assert checkpoints.config_shape({"num_hidden_layers": 2, "layer_types": ["chunked_attention"] * 2},
                                    "llama4").windowed is None
    assert checkpoints.inspect("org/some-model").shape().windowed is None
    for name, header, windowed in (("llama", {"general.architecture": "llama"}, False),
                                   ("gemma3", {"general.architecture": "gemma3",
                                               "gemma3.attention.sliding_window": 512}, True),
                                   ("gemma2", {"general.architecture": "gemma2"}, None)):
        write_gguf(tmp_path / f"{name}.gguf", header)
        assert checkpoints.Source("x", tmp_path, {}, name, f"{name}.gguf").shape().windowed is windowed, name
