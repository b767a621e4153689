"""analyses/haystacks.py on two tiny task runs of the same needles, one file marked as noise and one as prose: the
table it writes is read back against the runs' own per-example files; arms given the wrong way round are refused in
one line."""

from __future__ import annotations

import pandas as pd
import pytest

import spectra

import task_files

from .conftest import load, quiet


def test_noise_against_prose_of_two_runs(chat_decoder, tmp_path, capsys) -> None:
    rows = task_files.records(count=4)
    arms = {}
    for arm, haystack in (("noise", "noise"), ("prose", "prose.txt")):
        marked = [{**row, "haystack": haystack, "haystack_sha256": arm * 8} for row in rows]
        path = task_files.write(tmp_path / f"{arm}.jsonl", marked)
        arms[arm] = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / arm, presses="knorm,snapkv",
                                     ratios="0.5", progress=None, notify=quiet)
    script = load("haystacks")
    csv = tmp_path / "haystacks.csv"
    assert script.main(["--noise", str(arms["noise"].path), "--prose", str(arms["prose"].path), "--csv",
                        str(csv)]) == 0
    printed = capsys.readouterr().out
    assert "Kendall's τ between the two rankings: τ " in printed and "over 2 presses" in printed
    table = pd.read_csv(csv).set_index(["press", "ratio"])
    keys = ["press", "ratio", "example"]
    score = {arm: pd.read_csv(run.path / "task_examples.csv").set_index(keys)["score"] for arm, run in arms.items()}
    for (press, ratio), row in table.iterrows():
        assert row["noise"] == pytest.approx(score["noise"].loc[(press, ratio)].mean())
        assert row["delta"] == pytest.approx((score["prose"] - score["noise"]).loc[(press, ratio)].mean())
        assert row["examples"] == 4
    assert script.main(["--noise", str(arms["prose"].path), "--prose", str(arms["noise"].path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
