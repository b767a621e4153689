"""Noise against prose: the arms line up the same needles in two haystacks, and refuse what is not that (the
comparison itself: test_arms.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectra.errors import SpectraError
from spectra.report.evaluate import TaskRun
from spectra.report.arms import compared
from spectra.report.haystacks import ARMS, paired

RATIOS = (0.5, 0.75)
TASKS = ["a"] * 5 + ["b"] * 5
DEPTHS = [0.1 * (i % 5) for i in range(10)]


def run(name: str, haystack: str, scores: dict[str, list[list[float]]], depths: list[float] = DEPTHS,
        examples: int = 10) -> TaskRun:
    """A task run of `examples` records of tasks a and b that read `haystack`; `scores[press]` per ratio."""
    rows = [{"press": "full", "ratio": 0.0, "example": i, "question": 0, "task": TASKS[i], "depth": depths[i],
             "prediction": "42", "score": 1.0, "bytes_share": 1.0} for i in range(examples)]
    rows += [{"press": press, "ratio": ratio, "example": i, "question": 0, "task": TASKS[i], "depth": depths[i],
              "prediction": "x", "score": float(values[i]), "bytes_share": 1 - ratio}
             for press, per_ratio in scores.items() for ratio, values in zip(RATIOS, per_ratio)
             for i in range(examples)]
    meta = {"data": {"sha256": haystack, "name": "t.jsonl"}, "settings": {"seed": 0}, "model": {"name": "tiny"},
            "haystacks": [{"name": haystack, "sha256": "0", "tasks": ["a", "b"]}]}
    return TaskRun(Path("/runs") / name, meta, pd.DataFrame(rows), *[pd.DataFrame()] * 4)


WINDOW_NOISE = [[0, 0, 0, 0, 1, 0, 0, 0, 0, 1], [0] * 10]
WINDOW_PROSE = [[1, 1, 1, 0, 1, 1, 1, 1, 0, 1], [1, 0, 1, 0, 1, 1, 0, 1, 0, 0]]
KEYS = [[1, 1, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 0, 1, 1, 1, 1, 0, 1, 1]]


def test_the_arms_must_hide_the_same_needles_in_noise_and_prose() -> None:
    noise = run("noise", "noise", {"snapkv": WINDOW_NOISE})
    with pytest.raises(SpectraError, match="depth"):
        paired([noise], [run("prose", "prose.txt", {"snapkv": WINDOW_PROSE}, depths=[0.9] * 10)])
    with pytest.raises(SpectraError, match="read noise in the noise runs and noise in the prose runs"):
        paired([noise], [run("prose", "noise", {"snapkv": WINDOW_PROSE})])
    with pytest.raises(SpectraError, match="lack examples 8–9"):
        paired([noise], [run("prose", "prose.txt", {"snapkv": [v[:8] for v in WINDOW_PROSE]}, examples=8)])
    with pytest.raises(SpectraError, match="no press"):
        paired([noise], [run("prose", "prose.txt", {"keydiff": KEYS})])
    reseeded = run("prose", "prose.txt", {"snapkv": WINDOW_PROSE})
    reseeded.meta["settings"]["seed"] = 1
    with pytest.raises(SpectraError, match="differ in their seed"):
        paired([noise], [reseeded])


def test_the_prose_arm_may_hold_more_examples_than_the_noise_arm() -> None:
    """The board's prose run holds every task; the noise arm only the essay tasks: the pairs are the noise arm's."""
    noise = run("noise", "noise", {"snapkv": [v[:5] for v in WINDOW_NOISE]}, examples=5)
    rows = paired([noise], [run("prose", "prose.txt", {"snapkv": WINDOW_PROSE})])
    assert sorted(rows["example"].unique()) == [0, 1, 2, 3, 4]
    assert compared(rows, 0, ARMS).set_index(["press", "ratio"]).loc[("snapkv", 0.5), "examples"] == 5
