"""analyses/bridge.py on a tiny decoder's analyze run and a task run of snapkv, AdaKV and the rank-set headbudget: the
per-head table it writes read back against the run's needle.npz and the analyze run's metrics.csv, the picture
written, the budget compared at equal bytes, and an analyze run of another model refused in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd

import spectra
from spectra.report import published

import task_files

from .conftest import load, quiet


def test_the_bridge_of_an_analyze_run_and_a_task_run(chat_decoder, text_file, tmp_path, capsys) -> None:
    analysis = spectra.analyze(str(chat_decoder), str(text_file), length=64, samples=4, batch_size=2,
                               out=tmp_path / "analyze", progress=None, notify=quiet)
    path = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=4))
    budget = f"headbudget({analysis.path}@rank)"
    run = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "tasks", ratios="0.5",
                           presses=f"snapkv,adakv(snapkv),{budget}", progress=None, notify=quiet)
    script = load("bridge")
    csv, picture = tmp_path / "bridge.csv", tmp_path / "bridge.png"
    # the tiny model answers nothing: every question is read (--over all)
    assert script.main([str(analysis.path), str(run.path), "--over", "all", "--csv", str(csv), "--out",
                        str(picture)]) == 0
    printed = capsys.readouterr().out
    assert "Spearman's ρ" in printed and "against each reference on 4 examples" in printed
    table = pd.read_csv(csv)
    arrays = np.load(run.path / "needle.npz")
    metrics = pd.read_csv(analysis.path / "metrics.csv")
    rank = metrics["rank90_mean"].to_numpy().reshape(2, 2, 2).mean(-1)  # 2 layers, 2 key/value heads of 2 heads
    for index, (press, ratio) in enumerate(zip(arrays["press"], arrays["ratio"])):
        if press == "full":
            continue
        mine = table[(table["press"] == press) & (table["ratio"] == ratio)].sort_values(["layer", "head"])
        np.testing.assert_allclose(mine["survival"], arrays["survival"][index].mean(axis=0).ravel(), rtol=1e-12)
        np.testing.assert_allclose(mine["rank90"], rank.ravel(), rtol=1e-12)
    assert picture.exists() and picture.with_suffix(".pdf").exists()
    import matplotlib.image

    assert matplotlib.image.imread(picture).shape[1] > 1000
    compared = "\n".join(line for line in printed.splitlines() if "adakv(snapkv)" in line and "=" in line)
    assert " = " in compared and "≠" not in compared  # the same bytes as AdaKV on every example
    # published (the analyze run's tables, the task run's with its needle.npz), the same bridge from the folders
    folders = published.publish([analysis.path, run.path], tmp_path / "results")
    again = tmp_path / "again.csv"
    assert script.main([*map(str, folders), "--over", "all", "--csv", str(again)]) == 0
    assert capsys.readouterr().out == printed[:printed.index("drawn: ")]  # the same print, no picture asked
    assert again.read_bytes() == csv.read_bytes()
    other = tmp_path / "other"
    shutil.copytree(analysis.path, other)
    meta = json.loads((other / "run.json").read_text())
    meta["model"]["name"] = "another"
    (other / "run.json").write_text(json.dumps(meta))
    assert script.main([str(other), str(run.path), "--over", "all"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "ran different models (name" in error
