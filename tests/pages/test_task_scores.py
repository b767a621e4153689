"""The task-scores page on a task run whose per-example scores are set by hand: the means recounted, the best and
worst press at half the cache, and the runs it refuses."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from spectra.errors import SpectraError
from spectra.pages import PAGES
from spectra.report.evaluate import TaskRun

#: per (press, ratio), how many of 10 passkey examples answer; vt is answered by none, the full cache included
ANSWERED = {("full", 0.0): 10, ("knorm", 0.5): 9, ("knorm", 0.75): 4, ("snapkv", 0.5): 2, ("snapkv", 0.75): 0}


def task_run(answered: dict = ANSWERED) -> TaskRun:
    rows = [{"press": press, "ratio": ratio, "example": task * 10 + i, "task": ("passkey", "vt")[task],
             "length": 512, "score": float(task == 0 and i < count)}
            for (press, ratio), count in answered.items() for task in range(2) for i in range(10)]
    return TaskRun(Path("run"), {"model": {"name": "m"}}, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(),
                   pd.DataFrame(), pd.DataFrame())


def test_the_page_quotes_the_held_tasks_means() -> None:
    sheet = PAGES["task-scores"].render([task_run()])
    values = sheet.values
    assert values["held"] == "`passkey`" and values["dropped"] == "`vt` (0.00)" and values["full_score"] == "1.00"
    assert "| `knorm` | 0.90 | 0.40 |" in values["table"] and "| `snapkv` | 0.20 | 0.00 |" in values["table"]
    assert (values["best"], values["best_score"], values["worst"], values["worst_score"]) == \
        ("`knorm`", "0.90", "`snapkv`", "0.20")
    assert sheet.claims == {"a-press-holds-at-half": True, "presses-spread-wide": True}


def test_runs_it_cannot_read_are_one_line() -> None:
    page = PAGES["task-scores"]
    with pytest.raises(SpectraError, match="reads one task run, got 2"):
        page.render([task_run(), task_run()])
    with pytest.raises(SpectraError, match="answers no task"):
        page.render([task_run({**ANSWERED, ("full", 0.0): 3})])
    with pytest.raises(SpectraError, match="ran the ratios 0.75: the page compares presses at 0.5"):
        page.render([task_run({key: value for key, value in ANSWERED.items() if key[1] != 0.5})])
