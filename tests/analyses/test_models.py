"""analyses/models.py on two tiny decoders (one model's weights under two names) and their task runs of the same
needles: the table it writes is read back against the runs' own per-example files, the picture is written, and one
model given as both arms is refused in one line."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

import spectra

import task_files

from .conftest import load, quiet


def test_two_models_on_the_same_needles(chat_decoder, tmp_path, capsys) -> None:
    # answered by the letter e, which most five-token answers of the tiny decoder's vocabulary hold (a random tiny
    # model answers no needle, and the models are compared on the tasks both full caches answer)
    path = task_files.write(tmp_path / "tasks.jsonl", [{**row, "answers": ["e"]} for row in task_files.records(count=4)])
    other = tmp_path / "other-decoder"
    shutil.copytree(chat_decoder, other)
    runs = {name: spectra.evaluate(str(model), str(path), out=tmp_path / name, presses="knorm,snapkv", ratios="0.5",
                                   progress=None, notify=quiet)
            for name, model in (("first", chat_decoder), ("second", other))}
    script = load("models")
    csv, picture = tmp_path / "models.csv", tmp_path / "models"
    assert script.main(["--first", str(runs["first"].path), "--second", str(runs["second"].path), "--csv", str(csv),
                        "--out", str(picture)]) == 0
    printed = capsys.readouterr().out
    assert "Kendall's τ between the two rankings: τ " in printed and "over 2 presses" in printed
    assert (tmp_path / "models.png").stat().st_size > 0
    table = pd.read_csv(csv).set_index(["press", "ratio"])
    names = [run.meta["model"]["name"] for run in runs.values()]
    keys = ["press", "ratio", "example"]
    score = {name: pd.read_csv(run.path / "task_examples.csv").set_index(keys)["score"]
             for name, run in zip(names, runs.values())}
    for (press, ratio), row in table.iterrows():
        assert row[names[0]] == pytest.approx(score[names[0]].loc[(press, ratio)].mean())
        assert row["delta"] == pytest.approx((score[names[1]] - score[names[0]]).loc[(press, ratio)].mean())
    assert script.main(["--first", str(runs["first"].path), "--second", str(runs["first"].path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
