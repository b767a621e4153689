"""analyses/haystacks.py on two tiny task runs of the same needles, one file marked as noise and one as prose: the
table it writes is read back against the runs' own per-example files; arms given the wrong way round are refused in
one line."""

from __future__ import annotations

import pandas as pd
import pytest

from .conftest import haystack_arms, load


def test_noise_against_prose_of_two_runs(chat_decoder, tmp_path, capsys) -> None:
    arms = haystack_arms(chat_decoder, tmp_path, "0.5")
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
