"""The many-question page on runs whose answers are set by hand: presses judged on the questions the full cache
answers, a cell the share of those answers kept."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from spectra.pages import PAGES
from spectra.report.evaluate import TaskRun

#: (example, question) → answered: the full cache answers 6 of 8 questions; the press keeps the first 3 at r = 0.5
FULL = {(example, question): (example, question) not in ((0, 1), (3, 0)) for example in range(4) for question in range(2)}


def many_questions() -> TaskRun:
    rows = []
    kept = 0
    for (example, question), answered in FULL.items():
        rows.append({"press": "full", "ratio": 0.0, "example": example, "question": question, "task": "mq",
                     "length": 512, "prediction": "a", "score": float(answered), "bytes_share": 1.0, "kept": 1.0})
        keep = answered and kept < 3
        kept += keep
        rows.append({"press": "knorm", "ratio": 0.5, "example": example, "question": question, "task": "mq",
                     "length": 512, "prediction": "b", "score": float(keep), "bytes_share": 0.5, "kept": 0.5})
    meta = {"model": {"name": "m"}, "data": {"name": "q.jsonl", "sha256": "s"}, "settings": {"seed": 0}}
    return TaskRun(Path("q"), meta, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                   pd.DataFrame())


def test_presses_are_judged_on_the_answers_the_full_cache_gives() -> None:
    sheet = PAGES["questions"].render([many_questions()])
    values = sheet.values
    assert (values["records"], values["questions"], values["answered"]) == ("4", "8", "6")
    knorm = next(line for line in values["table"].splitlines() if "`knorm`" in line).split("|")
    assert knorm[4].strip().startswith(f"{3 / 6:.2f} [")  # rank, tier, press, then r = 0.5
    assert values["full"].startswith(f"{6 / 8:.2f} [") and values["first"] == "`knorm`"
    assert sheet.claims["full-below-holds"] and sheet.claims["first-loses-some"]
