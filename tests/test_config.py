"""Choice sets, the checks options share, and the run configuration (each analysis's options: tests/kinds/)."""

from __future__ import annotations

import json

import pytest

from spectra.config import (
    Device,
    Mode,
    Projection,
    RunConfig,
    Sharing,
    check_budgets,
    check_eps,
    choose,
    indices,
    layers_label,
    parse_layers,
)
from spectra.errors import SpectraError
from spectra.inputs import numbers


def test_choices_are_their_strings() -> None:
    assert Mode("pack") is Mode.PACK and Mode.PACK == "pack" and str(Mode.PACK) == "pack"
    assert f"linformer({Sharing.KV})" == "linformer(kv)"
    assert json.dumps({"mode": Mode.TRUNCATE}) == '{"mode": "truncate"}'
    with pytest.raises(SpectraError, match="unknown projection 'gauss'; use one of gaussian, orthogonal") as raised:
        choose(Projection, "gauss", "--projection")
    assert raised.value.for_cli() == "unknown --projection 'gauss'; use one of gaussian, orthogonal"


def test_run_config_checks_and_coerces() -> None:
    config = RunConfig("m", "d", length=16, samples=3, mode="truncate", device="cpu")
    assert config.mode is Mode.TRUNCATE and config.device is Device.CPU
    for kwargs, message in [({"length": 1}, "length must be at least 2"), ({"samples": 0}, "samples must be"),
                            ({"batch_size": 0}, "batch_size must be"), ({"seed": -1}, "seed must be a non-negative"),
                            ({"mode": "stack"}, "unknown mode 'stack'; use one of pack, truncate"),
                            ({"dtype": "int8"}, "unknown dtype 'int8'"), ({"device": "tpu"}, "unknown device"),
                            ({"threads": 0}, "threads must be a positive integer"),
                            ({"threads": True}, "threads must be a positive integer")]:
        with pytest.raises(SpectraError, match=f"^{message}") as raised:
            RunConfig("m", "d", **kwargs)
        assert raised.value.for_cli().startswith(("--", "unknown --")), "the command line reads its own spelling"


def test_settings_are_the_run_identity() -> None:
    config = RunConfig("./models/tiny", "corpus.txt", length=32, trust_remote_code=True, out="x", resume=True,
                       checkpoint_seconds=5)
    settings = config.settings({"at": 8})
    assert "threads" not in settings and RunConfig("m", "d", threads=3).settings({}) == RunConfig("m", "d").settings({})
    assert settings["extra"] == {"at": 8} and "trust_remote_code" not in settings
    assert set(settings) == {"model", "data", "length", "samples", "mode", "batch_size", "seed", "split",
                             "text_column", "device", "dtype", "extra"}, "where and how often it writes is no identity"
    assert str(config.default_out("analyze")) == "runs/tiny-corpus-n32"
    assert str(config.default_out("approx")) == "runs/tiny-corpus-n32-approx"


def test_local_paths_are_recorded_absolute(tmp_path, monkeypatch) -> None:
    """A resume from another directory, or with ./corpus.txt for corpus.txt, is the same run: local model and
    data paths are recorded absolute; hub ids and dataset names stay as written."""
    (tmp_path / "corpus.txt").write_text("some text\n")
    (tmp_path / "tiny").mkdir()
    monkeypatch.chdir(tmp_path)
    config = RunConfig("./tiny", "corpus.txt", length=32)
    assert config.data == str(tmp_path / "corpus.txt") and config.model == str(tmp_path / "tiny")
    assert RunConfig(str(tmp_path / "tiny"), "./corpus.txt").settings({}) == RunConfig("tiny", "corpus.txt").settings({})
    assert str(config.default_out("analyze")) == "runs/tiny-corpus-n32"
    hub = RunConfig("roberta-base", "imdb")
    assert (hub.model, hub.data) == ("roberta-base", "imdb")


def test_budgets_eps_and_lists() -> None:
    assert check_budgets([64, 8, 8], 64) == (8, 64)
    with pytest.raises(SpectraError, match="budget 0 is not a positive integer"):
        check_budgets([0], 8)
    with pytest.raises(SpectraError, match="budget 9 exceeds the sequence length n = 8"):
        check_budgets([4, 9], 8)
    with pytest.raises(SpectraError, match="the list of budgets is empty"):
        check_budgets([])
    assert check_eps([0.5, 0.1]) == (0.1, 0.5)
    with pytest.raises(SpectraError, match="strictly between 0 and 1"):
        check_eps([1.0])
    assert numbers("32, 64,128", "--budget") == [32, 64, 128] and numbers("0.1,0.5", "--eps", float) == [0.1, 0.5]
    with pytest.raises(SpectraError, match="budget 'a,b' is not a comma-separated list of integers") as raised:
        numbers("a,b", "--budget")
    assert raised.value.for_cli().startswith("--budget 'a,b' is not")


def test_layers_parse_and_label_round_trip() -> None:
    assert parse_layers("6-8,11,0") == (0, 6, 7, 8, 11) and parse_layers("all") is None and parse_layers(None) is None
    assert layers_label((0, 6, 7, 8, 11)) == "0,6-8,11" and layers_label(None) == "all"
    for text in ("x-y", "3-1"):
        with pytest.raises(SpectraError, match="^layers") as raised:
            parse_layers(text)
        assert raised.value.for_cli().startswith("--layers")


def test_indices_take_text_one_index_or_several() -> None:
    assert indices("0,3,5-7", "layer") == (0, 3, 5, 6, 7) and indices(3, "layer") == (3,)
    assert indices([2, 0, 2], "head") == (0, 2) and indices(None, "layer") is None and indices("all", "head") is None


def test_resume_and_overwrite_together_are_refused() -> None:
    """--resume continues a run, --overwrite replaces it: given both, neither is what the user meant for sure."""
    with pytest.raises(SpectraError, match="resume=True continues the run at out and overwrite=True replaces it") as raised:
        RunConfig("m", "d", resume=True, overwrite=True)
    assert raised.value.for_cli() == ("--resume continues the run at --out and --overwrite replaces it: pass only one "
                                      "of them")
