"""Two models on the same needles: lined up on the examples and the tasks both full caches hold, each model's
baseline per task, and refused in one line where the arms are one model, another seed, other needles or other
haystacks; then compared (`report.arms`) with each model's verdict against its own full cache."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from spectra.errors import SpectraError
from spectra.report.arms import HOLDS, LOSES, compared, ranked
from spectra.report.evaluate import TaskRun
from spectra.report.models import paired

TASKS = ["a"] * 4 + ["b"] * 4
DEPTHS = [0.25 * (i % 4) for i in range(8)]


def run(model: str, scores: dict[str, list[float]], full: list[float] | None = None, examples: int = 8,
        depths: list[float] = DEPTHS, seed: int = 0, haystack: str = "prose.txt") -> TaskRun:
    """A task run of `model` over `examples` records of tasks a and b at ratio 0.5; `scores[press]` per example."""
    full = full or [1.0] * examples
    rows = [{"press": "full", "ratio": 0.0, "example": i, "question": 0, "task": TASKS[i], "depth": depths[i],
             "prediction": "42", "score": full[i], "bytes_share": 1.0} for i in range(examples)]
    rows += [{"press": press, "ratio": 0.5, "example": i, "question": 0, "task": TASKS[i], "depth": depths[i],
              "prediction": "x", "score": float(values[i]), "bytes_share": 0.5}
             for press, values in scores.items() for i in range(examples)]
    meta = {"data": {"sha256": model, "name": f"{model}.jsonl"}, "settings": {"seed": seed}, "model": {"name": model},
            "haystacks": [{"name": haystack, "sha256": "0", "tasks": ["a", "b"]}]}
    return TaskRun(Path("/runs") / model, meta, pd.DataFrame(rows), *[pd.DataFrame()] * 4)


KEEPS = [1.0] * 8
LOSES_B = [1.0] * 4 + [0.0] * 4


def test_the_models_are_compared_on_the_tasks_both_full_caches_hold() -> None:
    smol = run("smol", {"snapkv": KEEPS, "knorm": LOSES_B})
    gemma = run("gemma", {"snapkv": LOSES_B, "knorm": KEEPS}, full=[1.0] * 4 + [1.0, 1.0, 0.0, 0.0])
    pair = paired([smol], [gemma])
    assert pair.arms == ("smol", "gemma")
    assert sorted(pair.rows["task"].unique()) == ["a"]  # gemma's full cache answers half of b: b is left out
    baseline = pair.baseline.set_index(["task", "model"])
    assert baseline.loc[("b", "gemma"), "full"] == 0.5 and not baseline.loc[("b", "smol"), "held"]
    assert baseline.loc[("a", "smol"), "examples"] == 4 and baseline.loc[("a", "gemma"), "held"]
    table = compared(pair.rows, 0, pair.arms).set_index(["press", "ratio"])
    assert table.loc[("snapkv", 0.5), "examples"] == 4 and table.loc[("snapkv", 0.5), "smol_verdict"] == HOLDS


def test_a_verdict_flips_where_one_model_loses_what_the_other_keeps() -> None:
    lost = [0.0] * 8
    pair = paired([run("smol", {"snapkv": KEEPS, "knorm": lost})], [run("gemma", {"snapkv": lost, "knorm": lost})])
    table = compared(pair.rows, 0, pair.arms).set_index(["press", "ratio"])
    assert tuple(table.loc[("snapkv", 0.5), ["smol_verdict", "gemma_verdict", "flips"]]) == (HOLDS, LOSES, True)
    assert not table.loc[("knorm", 0.5), "flips"]
    order, tau = ranked(pair.rows, 0, pair.arms)
    assert list(order.columns) == ["press", "smol_score", "gemma_score", "smol_rank", "gemma_rank", "smol_tier",
                                   "gemma_tier"]


def test_the_examples_both_hold_are_compared() -> None:
    pair = paired([run("smol", {"snapkv": KEEPS})], [run("gemma", {"snapkv": KEEPS[:6]}, examples=6)])
    assert sorted(pair.rows["example"].unique()) == [0, 1, 2, 3, 4, 5]


def test_what_is_not_two_models_on_the_same_needles_is_refused_in_one_line() -> None:
    smol = run("smol", {"snapkv": KEEPS})
    with pytest.raises(SpectraError, match="both arms ran smol"):
        paired([smol], [run("smol", {"snapkv": KEEPS})])
    with pytest.raises(SpectraError, match="differ in their seed"):
        paired([smol], [run("gemma", {"snapkv": KEEPS}, seed=1)])
    with pytest.raises(SpectraError, match="the arms must hide the same needles"):
        paired([smol], [run("gemma", {"snapkv": KEEPS}, depths=[0.9] * 8)])
    with pytest.raises(SpectraError, match="read prose.txt with smol and noise with gemma"):
        paired([smol], [run("gemma", {"snapkv": KEEPS}, haystack="noise")])
    with pytest.raises(SpectraError, match="no task's full cache"):
        paired([smol], [run("gemma", {"snapkv": KEEPS}, full=[0.0] * 8)])
    with pytest.raises(SpectraError, match="no press ran"):
        paired([smol], [run("gemma", {"knorm": KEEPS})])
