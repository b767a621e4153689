"""The registry: every analysis registered once, run directories load through their kind, refusals are one line."""

from __future__ import annotations

import json

import pytest

from spectra.config import RunConfig
from spectra.errors import SpectraError
from spectra.kinds import REGISTRY, load_run
from spectra.kinds.base import Analysis, read_meta, register, upgraded


def test_every_analysis_is_registered_with_its_declarations() -> None:
    assert {"analyze", "approx", "theorems", "scaling"} <= set(REGISTRY)
    for name, analysis in REGISTRY.items():
        assert analysis.name == name and analysis.summary and isinstance(analysis.options, type)
        assert set(analysis.run_fields) <= {field for field in RunConfig.__dataclass_fields__}
        assert all(isinstance(columns, tuple) for columns in analysis.outputs.values())
    with pytest.raises(ValueError, match="registered twice"):
        register(REGISTRY["analyze"])


def test_load_run_dispatches_on_the_kind_and_refuses_in_one_line(tmp_path) -> None:
    with pytest.raises(SpectraError, match="no run.json"):
        read_meta(tmp_path)
    partial = tmp_path / "x.partial"
    partial.mkdir()
    with pytest.raises(SpectraError, match="finish it with --resume"):
        load_run(partial)
    (tmp_path / "run.json").write_text(json.dumps({"kind": "unknown-kind"}))
    with pytest.raises(SpectraError, match="holds a 'unknown-kind' run, which this version of spectra cannot read"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"kind": "theorems"}))
    with pytest.raises(SpectraError, match="holds a run of 'spectra theorems'; this needs a run of 'spectra analyze'"):
        load_run(tmp_path, "analyze")


def test_an_analysis_without_a_job_says_so() -> None:
    class Bare(Analysis):
        name = "bare"

    with pytest.raises(NotImplementedError, match="bare runs no single job"):
        Bare().job(RunConfig("m", "d"), None, None, None)
    assert Bare().plot(None) == []


def test_runs_written_before_samples_meant_the_evaluated_sequences_read_alike() -> None:
    """Old run.json files with a calibration counted every sequence under `samples`; read back, `samples` is the
    evaluated ones and `sequences` every one read, as runs record them now."""
    old = {"kind": "approx", "samples": 10, "evaluation": [4, 10]}
    assert upgraded(old) == {"kind": "approx", "samples": 6, "sequences": 10, "evaluation": [4, 10]}
    assert upgraded(old) is not old and old["samples"] == 10
    new = {"kind": "approx", "samples": 6, "sequences": 10, "evaluation": [4, 10]}
    assert upgraded(new) == new and upgraded({"kind": "analyze", "samples": 3}) == {"kind": "analyze", "samples": 3}
