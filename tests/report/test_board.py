"""A board's rankings are bootstrapped once and its CSV holds every cell and mean beside the press's rank."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from spectra.errors import SpectraError
from spectra.report import board as boards
from spectra.report import leaderboard
from spectra.report.evaluate import TaskRun


def run(press: str, answered: dict[float, int]) -> TaskRun:
    """10 passkey examples, the full cache answering all, `press` answering the first answered[ratio] at a ratio."""
    rows = [{"press": name, "ratio": ratio, "example": example, "question": 0, "task": "passkey",
             "prediction": "a" if name == "full" else "b", "score": float(name == "full" or example < count),
             "bytes_share": 1 - ratio, "kept": 1 - ratio}
            for example in range(10)
            for name, ratio, count in [("full", 0.0, 10), *((press, ratio, count) for ratio, count in answered.items())]]
    meta = {"model": {"name": "m"}, "data": {"name": "t.jsonl", "sha256": "s"}, "settings": {"seed": 0}}
    return TaskRun(Path(press), meta, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                   pd.DataFrame())


def test_the_board_ranks_once_and_its_table_holds_each_cell_and_mean(monkeypatch) -> None:
    board = boards.pooled_board([run("good", {0.5: 9, 0.75: 7}), run("bad", {0.5: 3, 0.75: 1})])
    calls = []
    ranking = leaderboard.ranking
    monkeypatch.setattr(leaderboard, "ranking", lambda *args, **kwargs: calls.append(1) or ranking(*args, **kwargs))
    assert board.ranking() is board.ranking() and len(calls) == 1
    table = boards.ranking_csv(board.standings(), board.ranking())
    assert len(table) == 2 + 2 * 3  # the full cache: its cell and its mean; each press: two ratios and the mean
    good = table[table["press"] == "good"].set_index("ratio")["score"]
    assert good[0.5] == pytest.approx(0.9) and good[0.75] == pytest.approx(0.7) and good["mean"] == pytest.approx(0.8)
    assert table.drop_duplicates("press").set_index("press")["rank"].to_dict() == {"full": 0, "good": 1, "bad": 2}


def test_a_run_that_is_not_a_task_run_is_named() -> None:
    class Text:
        path = Path("runs/nll")

    with pytest.raises(SpectraError, match="runs/nll is not a task run of spectra evaluate"):
        boards.pooled_board([Text()])
