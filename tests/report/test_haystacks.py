"""Noise against prose: the same needles in two haystacks, scores side by side with paired differences, and the two
rankings' Kendall τ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

from spectra.errors import SpectraError
from spectra.kv.tasks.summary import poisson_weights
from spectra.report.evaluate import TaskRun
from spectra.report.haystacks import compared, paired, ranked

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


def test_scores_side_by_side_with_a_paired_difference_over_the_same_needles() -> None:
    noise = run("noise", "noise", {"snapkv": WINDOW_NOISE, "keydiff": KEYS})
    prose = run("prose", "/usr/share/common-licenses", {"snapkv": WINDOW_PROSE, "keydiff": KEYS})
    rows = paired([noise], [prose])
    table = compared(rows, seed=0).set_index(["press", "ratio"])
    assert table.loc[("full", 0.0), "delta"] == 0
    for ratio, low, high in zip(RATIOS, WINDOW_NOISE, WINDOW_PROSE):
        got = table.loc[("snapkv", ratio)]
        assert got["noise"] == pytest.approx(np.mean(low)) and got["prose"] == pytest.approx(np.mean(high))
        assert got["delta"] == pytest.approx(np.mean(high) - np.mean(low))
        assert got["changed"] == pytest.approx(np.mean(np.array(high) != np.array(low)))
        # the paired interval, computed here directly: per replicate, each task's Poisson-weighted mean of the
        # per-example difference, the tasks combined by their shares
        weights = poisson_weights(range(10), 0)
        diff = np.array(high, float) - np.array(low, float)
        tasks = np.array(TASKS)
        with np.errstate(invalid="ignore"):
            per_task = [(weights[:, tasks == t] @ diff[tasks == t]) / weights[:, tasks == t].sum(axis=1)
                        for t in "ab"]
        used = np.all([weights[:, tasks == t].sum(axis=1) > 0 for t in "ab"], axis=0)
        direct = (0.5 * per_task[0] + 0.5 * per_task[1])[used]
        assert got["delta_low"] == pytest.approx(np.quantile(direct, 0.025), abs=1e-9)
        assert got["delta_high"] == pytest.approx(np.quantile(direct, 0.975), abs=1e-9)
    same = table.loc[("keydiff", 0.5)]
    assert same["delta"] == 0 and same["delta_low"] == 0 and same["delta_high"] == 0 and same["changed"] == 0


def test_kendall_tau_between_the_two_rankings() -> None:
    presses = {"snapkv": WINDOW_NOISE, "keydiff": KEYS, "random": [[0, 1] * 5, [0] * 10]}
    prose_scores = {"snapkv": WINDOW_PROSE, "keydiff": KEYS, "random": [[0, 1] * 5, [0] * 10]}
    rows = paired([run("n", "noise", presses)], [run("p", "prose.txt", prose_scores)])
    order, tau = ranked(rows, seed=0)
    means = {arm: [np.mean(np.mean(scores[press], axis=0)) for press in presses]
             for arm, scores in (("noise", presses), ("prose", prose_scores))}
    assert tau["tau"] == pytest.approx(kendalltau(means["noise"], means["prose"]).statistic)
    assert list(order["press"]) == ["keydiff", "snapkv", "random"]  # the prose arm's order
    assert order.set_index("press").loc["snapkv", "noise_rank"] == 3
    alike = paired([run("n", "noise", presses)], [run("p", "prose.txt", presses)])
    assert ranked(alike, seed=0)[1] == pytest.approx({"tau": 1.0, "low": 1.0, "high": 1.0, "presses": 3})


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
    assert compared(rows, seed=0).set_index(["press", "ratio"]).loc[("snapkv", 0.5), "examples"] == 5
