"""analyses/schedules.py on tiny runs: the exported lists are the schedules of spectra.kv.presses.schedules for the analyze
run's own measurements, and the measured cache run holds every scheduled press, registered for the run only."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

import spectra
from spectra.kv import presses
from spectra.kv.presses.schedules import layer_weights, pyramid, spectral

from .conftest import load


def test_schedules_export_and_measure(llama_dir, text_file, tmp_path) -> None:
    quiet = {"progress": None, "notify": lambda line: None}
    analyzed = spectra.analyze(str(llama_dir), str(text_file), length=24, samples=3, out=tmp_path / "a", **quiet)
    script = load("schedules")
    before = (presses.REGISTRY.names(), dict(presses.REGISTRY))
    out = tmp_path / "schedules"
    assert script.main([str(analyzed.path), "--ratios", "0.5,0.75", "--out", str(out), "--model", str(llama_dir),
                        "--data", str(text_file), "--context", "80", "--continuation", "8", "--samples", "2"]) == 0
    assert (presses.REGISTRY.names(), dict(presses.REGISTRY)) == before, "the scheduled presses were for that run only"
    frame = pd.read_csv(out / "schedules.csv")
    assert set(frame["schedule"]) == {"uniform", "pyramid", "key_rank", "entropy", "sink"}
    weights = layer_weights("entropy", analyzed.metrics, analyzed.qkv)
    assert json.loads((out / "entropy-0.75.json").read_text()) == spectral(weights)(0.75, 80)
    assert json.loads((out / "pyramid-0.5.json").read_text()) == pyramid(analyzed.layers)(0.5, 80)
    np.testing.assert_allclose(json.loads((out / "uniform-0.5.json").read_text()), [0.5] * analyzed.layers)
    measured = spectra.load_run(out / "cache").table
    assert {"snapkv", "snapkv@pyramid", "snapkv@key_rank", "snapkv@entropy", "snapkv@sink"} <= set(measured["press"])
    uniform_kept = measured[(measured["press"] == "snapkv") & (measured["ratio"] == 0.5)]["kept"].iloc[0]
    spectral_kept = measured[(measured["press"] == "snapkv@entropy") & (measured["ratio"] == 0.5)]["kept"].iloc[0]
    assert abs(spectral_kept - uniform_kept) <= 1, "equal total cache (up to whole tokens per layer)"
