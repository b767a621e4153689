"""analyses/question_drop.py on two tiny task runs of one many-question file: the drop it writes is the query-aware
run's score minus the query-agnostic run's, question by question, read from their own per-example files; runs in the
wrong order are refused in one line."""

from __future__ import annotations

import pandas as pd
import pytest

import spectra

import task_files

from .conftest import load, quiet


def test_the_drop_of_two_runs(chat_decoder, tmp_path, capsys) -> None:
    path = task_files.write(tmp_path / "many.jsonl", task_files.many_questions(task_files.records(count=3)))
    settings = dict(presses="knorm,snapkv", ratios="0.5", progress=None, notify=quiet)
    aware = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "aware", query_aware=True, **settings)
    once = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "once", **settings)
    script = load("question_drop")
    assert script.main([str(aware.path), str(once.path), "--csv", str(tmp_path / "drop.csv")]) == 0
    assert "the score with the question in view" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "drop.csv").set_index(["press", "ratio"])
    keys = ["press", "ratio", "example", "question"]
    mine = pd.read_csv(aware.path / "task_examples.csv").set_index(keys)["score"]
    theirs = pd.read_csv(once.path / "task_examples.csv").set_index(keys)["score"]
    for (press, ratio), row in table.iterrows():
        difference = (mine - theirs).loc[(press, ratio)]
        assert row["questions"] == len(difference) == 6
        assert row["drop"] == pytest.approx(difference.mean()) and row["drop_low"] <= row["drop"] <= row["drop_high"]
    assert script.main([str(once.path), str(aware.path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
