"""Options declared once: choice sets, the run's configuration, each analysis's options and their checks."""

from __future__ import annotations

import json

import pytest

from spectra.config import (AnalyzeOptions, ApproxOptions, Device, Mode, Projection, RunConfig, Sharing, Spectrum,
                            SyntheticConfig, TheoremOptions, check_budgets, check_eps, choose, layers_label,
                            parse_layers)
from spectra.errors import SpectraError
from spectra.inputs import numbers


def test_choices_are_their_strings() -> None:
    assert Mode("pack") is Mode.PACK and Mode.PACK == "pack" and str(Mode.PACK) == "pack"
    assert f"linformer({Sharing.KV})" == "linformer(kv)"
    assert json.dumps({"mode": Mode.TRUNCATE}) == '{"mode": "truncate"}'
    assert choose(Spectrum, "exact", "--spectrum") is Spectrum.EXACT
    with pytest.raises(SpectraError, match="unknown spectrum 'fast'; use one of exact"):
        choose(Spectrum, "fast", "--spectrum")  # removed: slower than exact on real attention
    with pytest.raises(SpectraError, match="unknown projection 'gauss'; use one of gaussian, orthogonal") as raised:
        choose(Projection, "gauss", "--projection")
    assert raised.value.for_cli() == "unknown --projection 'gauss'; use one of gaussian, orthogonal"


def test_run_config_checks_and_coerces() -> None:
    config = RunConfig("m", "d", length=16, samples=3, mode="truncate", device="cpu")
    assert config.mode is Mode.TRUNCATE and config.device is Device.CPU
    for kwargs, message in [({"length": 1}, "length must be at least 2"), ({"samples": 0}, "samples must be"),
                            ({"batch_size": 0}, "batch_size must be"), ({"seed": -1}, "seed must be a non-negative"),
                            ({"mode": "stack"}, "unknown mode 'stack'; use one of pack, truncate"),
                            ({"dtype": "int8"}, "unknown dtype 'int8'"), ({"device": "tpu"}, "unknown device")]:
        with pytest.raises(SpectraError, match=f"^{message}") as raised:
            RunConfig("m", "d", **kwargs)
        assert raised.value.for_cli().startswith(("--", "unknown --")), "the command line reads its own spelling"


def test_settings_are_the_run_identity() -> None:
    config = RunConfig("./models/tiny", "corpus.txt", length=32, trust_remote_code=True)
    settings = config.settings({"at": 8})
    assert settings["extra"] == {"at": 8} and "trust_remote_code" not in settings
    assert set(settings) == {"model", "data", "length", "samples", "mode", "batch_size", "seed", "split",
                             "text_column", "device", "dtype", "extra"}
    assert str(config.default_out("analyze")) == "runs/tiny-corpus-n32"
    assert str(config.default_out("approx")) == "runs/tiny-corpus-n32-approx"
    assert str(SyntheticConfig(n=64, d=8).default_out("theorems")) == "runs/synthetic-n64-d8-theorems"


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
    with pytest.raises(SpectraError, match="k = 0 is not a budget"):
        check_budgets([0], 8)
    with pytest.raises(SpectraError, match="k = 9 exceeds the sequence length n = 8"):
        check_budgets([4, 9], 8)
    with pytest.raises(SpectraError, match="the list of budgets is empty"):
        check_budgets([])
    assert check_eps([0.5, 0.1]) == (0.1, 0.5)
    with pytest.raises(SpectraError, match="strictly between 0 and 1"):
        check_eps([1.0])
    assert numbers("32, 64,128", "--k") == [32, 64, 128] and numbers("0.1,0.5", "--eps", float) == [0.1, 0.5]
    with pytest.raises(SpectraError, match="k 'a,b' is not a comma-separated list of integers") as raised:
        numbers("a,b", "--k")
    assert raised.value.for_cli().startswith("--k 'a,b' is not")


def test_layers_parse_and_label_round_trip() -> None:
    assert parse_layers("6-8,11,0") == (0, 6, 7, 8, 11) and parse_layers("all") is None and parse_layers(None) is None
    assert layers_label((0, 6, 7, 8, 11)) == "0,6-8,11" and layers_label(None) == "all"
    for text in ("x-y", "3-1"):
        with pytest.raises(SpectraError, match="^layers") as raised:
            parse_layers(text)
        assert raised.value.for_cli().startswith("--layers")


def test_analysis_options() -> None:
    assert AnalyzeOptions().resolved(512).at == 128 and AnalyzeOptions(at=5).resolved(8).at == 5
    with pytest.raises(SpectraError, match="at must be an index in 1…8"):
        AnalyzeOptions(at=9).resolved(8)
    with pytest.raises(SpectraError, match="unknown spectrum_device 'gpu'; use one of auto, cpu, same"):
        AnalyzeOptions(spectrum_device="gpu")
    options = ApproxOptions((12, 4, 4), ("svd",), layers=(1,), projection="orthogonal")
    assert options.budgets == (4, 12) and options.projection is Projection.ORTHOGONAL
    assert options.identity() == {"budgets": [4, 12], "methods": ["svd"], "end_to_end": False, "layers": [1],
                                  "target": 0.1, "projection": "orthogonal"}
    with pytest.raises(SpectraError, match="k = 12 exceeds the sequence length n = 8"):
        options.resolved(8)
    with pytest.raises(SpectraError, match="target must be a relative error in \\(0, 1\\)"):
        ApproxOptions((4,), ("svd",), target=2.0)
    assert TheoremOptions((8, 4), (0.5,)).identity() == {"budgets": [4, 8], "eps": [0.5], "draws": 1,
                                                         "fixed_projection": False}
    chosen = AnalyzeOptions(layers=(0, 2), heads=(1,), bootstrap=50).resolved(16).identity()
    assert chosen == {"at": 4, "spectrum": "exact", "layers": [0, 2], "heads": [1], "bootstrap": 50}
    assert AnalyzeOptions().resolved(16).identity() == {"at": 4, "spectrum": "exact"}, "old runs resume unchanged"
    with pytest.raises(SpectraError, match="bootstrap must be a number of replicates ≥ 0, got -1"):
        AnalyzeOptions(bootstrap=-1)
