"""Two arms paired by example (here noise and prose, as `report.haystacks` lines them up): scores side by side with a
paired difference computed here directly, each arm's verdict against its own full cache and where it flips, and the
two rankings' Kendall τ."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

from spectra.kv.tasks.summary import poisson_weights
from spectra.report.arms import HOLDS, LOSES, compared, ranked, tau_text
from spectra.report.haystacks import ARMS, paired

from .test_haystacks import KEYS, RATIOS, TASKS, WINDOW_NOISE, WINDOW_PROSE, run


def test_scores_side_by_side_with_a_paired_difference_over_the_same_needles() -> None:
    noise = run("noise", "noise", {"snapkv": WINDOW_NOISE, "keydiff": KEYS})
    prose = run("prose", "/usr/share/common-licenses", {"snapkv": WINDOW_PROSE, "keydiff": KEYS})
    rows = paired([noise], [prose])
    table = compared(rows, 0, ARMS).set_index(["press", "ratio"])
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
    order, tau = ranked(rows, 0, ARMS)
    means = {arm: [np.mean(np.mean(scores[press], axis=0)) for press in presses]
             for arm, scores in (("noise", presses), ("prose", prose_scores))}
    assert tau["tau"] == pytest.approx(kendalltau(means["noise"], means["prose"]).statistic)
    assert list(order["press"]) == ["keydiff", "snapkv", "random"]  # the prose arm's order
    assert order.set_index("press").loc["snapkv", "noise_rank"] == 3
    alike = paired([run("n", "noise", presses)], [run("p", "prose.txt", presses)])
    assert ranked(alike, 0, ARMS)[1] == pytest.approx({"tau": 1.0, "low": 1.0, "high": 1.0, "presses": 3})


def test_each_arm_has_tiers_that_only_a_paired_test_separates() -> None:
    """Two presses answering every example against two answering none: on the arm where they differ, two tiers;
    where all four answer alike, one."""
    kept, lost = [[1] * 10, [1] * 10], [[0] * 10, [0] * 10]
    rows = paired([run("n", "noise", {"snapkv": kept, "keydiff": kept, "tova": lost, "random": lost})],
                  [run("p", "prose.txt", {"snapkv": kept, "keydiff": kept, "tova": kept, "random": kept})])
    order = ranked(rows, 0, ARMS)[0].set_index("press")
    assert order["noise_tier"].to_dict() == {"snapkv": 1, "keydiff": 1, "tova": 2, "random": 2}
    assert set(order["prose_tier"]) == {1}
    # a press a single example apart from the first is not separated from it
    close = [[1] * 10, [1] * 9 + [0]]
    rows = paired([run("n", "noise", {"snapkv": kept, "keydiff": close})],
                  [run("p", "prose.txt", {"snapkv": kept, "keydiff": close})])
    assert set(ranked(rows, 0, ARMS)[0]["noise_tier"]) == {1}


def test_each_arm_judges_a_press_against_its_own_full_cache_and_a_flip_is_a_verdict_that_differs() -> None:
    lost, kept = [[0] * 10, [0] * 10], [[1] * 10, [1] * 10]
    rows = paired([run("n", "noise", {"snapkv": lost, "keydiff": kept, "tova": lost})],
                  [run("p", "prose.txt", {"snapkv": kept, "keydiff": kept, "tova": lost})])
    table = compared(rows, 0, ARMS).set_index(["press", "ratio"])
    for ratio in RATIOS:
        assert tuple(table.loc[("snapkv", ratio), ["noise_verdict", "prose_verdict", "flips"]]) == (LOSES, HOLDS, True)
        assert tuple(table.loc[("keydiff", ratio), ["noise_verdict", "prose_verdict", "flips"]]) == (HOLDS, HOLDS,
                                                                                                     False)
        assert tuple(table.loc[("tova", ratio), ["noise_verdict", "prose_verdict", "flips"]]) == (LOSES, LOSES, False)
    assert table.loc[("full", 0.0), "noise_verdict"] == "" and not table.loc[("full", 0.0), "flips"]
    # one needle lost of ten: the paired interval reaches 0, so the press holds
    almost = [[1] * 9 + [0], [1] * 10]
    rows = paired([run("n", "noise", {"snapkv": almost})], [run("p", "prose.txt", {"snapkv": almost})])
    assert compared(rows, 0, ARMS).set_index(["press", "ratio"]).loc[("snapkv", 0.5), "noise_verdict"] == HOLDS


def test_tau_is_written_with_its_interval_or_said_undefined_where_an_arm_ties_every_press() -> None:
    assert tau_text({"tau": 0.6234, "low": 0.41, "high": 0.8, "presses": 20}) == "τ = 0.62 [0.41–0.80] over 20 presses"
    assert tau_text({"tau": float("nan"), "low": 1.0, "high": 1.0, "presses": 2}).startswith(
        "τ undefined over 2 presses: every press ties in one arm")

