"""What the tests of the README machinery share: the scripts of analyses/ loaded from beside them, tiny decoder and
cache runs, and readers of a run's own files (CSV and JSON read with pandas, not through spectra's summaries)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

import spectra

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "analyses"))  # the scripts import their modules from beside them


def load(name: str):
    """analyses/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "analyses" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def quiet(line: str) -> None:
    pass


def slashed(values, format) -> str:
    return " / ".join(format(value) for value in values)


def layer_means(path: Path, method: str, table: str = "heads.csv") -> pd.Series:
    """Per budget, the mean over layers of the mean over heads of out_err, straight from the CSV file."""
    frame = pd.read_csv(path / table)
    frame = frame[(frame["method"] == method) & (frame["metric"] == "out_err")]
    return frame.groupby(["budget", "layer"])["mean"].mean().groupby("budget").mean()


def haystack_arms(decoder: Path, folder: Path, ratios: str) -> dict:
    """Two tiny task runs of the same four passkey needles (knorm, snapkv at `ratios`), one file marked as reading
    RULER's noise and one as reading prose: the noise-against-prose comparison's arms, by name."""
    import task_files

    rows, arms = task_files.records(count=4), {}
    for arm, haystack in (("noise", "noise"), ("prose", "prose.txt")):
        marked = [{**row, "haystack": haystack, "haystack_sha256": arm * 8} for row in rows]
        path = task_files.write(folder / f"{arm}.jsonl", marked)
        arms[arm] = spectra.evaluate(str(decoder), str(path), out=folder / arm, presses="knorm,snapkv",
                                     ratios=ratios, progress=None, notify=quiet)
    return arms


def meta(run) -> dict:
    return json.loads((run.path / "run.json").read_text())


@pytest.fixture(scope="session")
def decoder_runs(llama_dir, text_file, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("decoder")
    common = dict(length=24, samples=4, batch_size=2, progress=None, notify=quiet)
    return {"analyze": [spectra.analyze(str(llama_dir), str(text_file), out=root / "a", **common)],
            "approx": [spectra.approx(str(llama_dir), str(text_file), budget=[4, 8],
                                      methods="window,topk,performer-causal", end_to_end=True, out=root / "b", **common)]}


@pytest.fixture(scope="session")
def cache_run(llama_dir, text_file, tmp_path_factory):
    return spectra.cache(str(llama_dir), str(text_file), context=70, continuation=6, samples=2,
                         presses="streaming,knorm,snapkv,tova,random,observed,think,pca_leverage,loki,lowrank,linformer",
                         ratios="0.25,0.5", out=tmp_path_factory.mktemp("cache") / "c", progress=None, notify=quiet)
