"""The axis map against a table written by hand and against loops written here: per byte budget, layer and key/value
head, each axis' least error among its measurements that fit, the best axis, the diagnosis joined per key/value
head, and the per-budget summary."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from spectra.kv.axes import (
    AXES,
    best_axes,
    check_plan_ratios,
    dominant_type,
    join_diagnosis,
    kv_head_errors,
    plan_budget,
    summary,
)
from spectra.errors import SpectraError

AXES_OF = {"snapkv": "tokens", "knorm": "tokens", "think": "channels", "lowrank": "rank", "kivi2": "bits"}


def head_rows(rng: np.random.Generator, layers: int = 3, heads: int = 4) -> pd.DataFrame:
    """cache_heads.csv-like rows: every press at three ratios, random errors and bytes shares (the same within a
    key/value head of 2 query heads, as a press stores one cache per key/value head)."""
    rows = [{"press": "full", "ratio": 0.0, "layer": layer, "head": head, "mass_kept": 1.0, "out_err": 0.0,
             "bytes_share": 1.0} for layer in range(layers) for head in range(heads)]
    for press, ratio, layer in itertools.product(AXES_OF, (0.25, 0.5, 0.75), range(layers)):
        for kv in range(heads // 2):
            share = {"channels": 1 - ratio / 2, "bits": 0.3}.get(AXES_OF[press], 1 - ratio) + rng.uniform(-0.02, 0.02)
            for head in (2 * kv, 2 * kv + 1):
                rows.append({"press": press, "ratio": ratio, "layer": layer, "head": head, "mass_kept": np.nan,
                             "out_err": rng.uniform(0.01, 1.0), "bytes_share": share})
    return pd.DataFrame(rows)


def test_a_hand_made_table() -> None:
    rows = []
    for press, ratio, share, errors in (("snapkv", 0.5, 0.5, (0.2, 0.4)), ("snapkv", 0.75, 0.25, (0.5, 0.7)),
                                        ("think", 0.5, 0.75, (0.05, 0.05)), ("kivi2", 0.5, 0.3, (0.1, 0.3)),
                                        ("lowrank", 0.5, 0.52, (0.01, 0.01))):
        rows += [{"press": press, "ratio": ratio, "layer": 0, "head": head, "out_err": error, "bytes_share": share}
                 for head, error in enumerate(errors)]
    axes = best_axes(pd.DataFrame(rows), AXES_OF, 1, [0.5, 0.3])
    at_half = axes[axes["budget"] == 0.5].set_index("axis")
    # within half the bytes: snapkv at 0.5 (0.3) beats snapkv at 0.75 (0.6); ThinK (0.75) and lowrank (0.52) do not fit
    assert list(at_half.index) == ["tokens", "bits"]
    assert at_half.loc["tokens", "ratio"] == 0.5 and at_half.loc["tokens", "out_err"] == pytest.approx(0.3)
    assert at_half.loc["bits", "out_err"] == pytest.approx(0.2) and at_half["best"].tolist() == [False, True]
    at_third = axes[axes["budget"] == 0.3].set_index("axis")
    assert list(at_third.index) == ["tokens", "bits"] and at_third.loc["tokens", "ratio"] == 0.75
    assert at_third.loc["bits", "best"] and at_third.loc["bits", "bytes_share"] == 0.3
    assert list(axes.columns) == ["budget", "layer", "kv_head", "axis", "press", "ratio", "bytes_share", "out_err",
                                  "best"]


def test_best_axes_equal_loops() -> None:
    stats = head_rows(np.random.default_rng(0))
    budgets = [0.3, 0.5, 0.8]
    got = best_axes(stats, AXES_OF, 2, budgets).set_index(["budget", "layer", "kv_head", "axis"])
    for budget, layer, kv in itertools.product(budgets, range(3), range(2)):
        errors = {}
        for axis in AXES:
            candidates = []
            for (press, ratio), group in stats[(stats["layer"] == layer) & stats["head"].isin([2 * kv, 2 * kv + 1])
                                               & (stats["press"] != "full")].groupby(["press", "ratio"]):
                if AXES_OF[press] == axis and group["bytes_share"].mean() <= budget:
                    candidates.append((group["out_err"].mean(), press, ratio))
            if not candidates:
                assert (budget, layer, kv, axis) not in got.index
                continue
            error, press, ratio = min(candidates)
            row = got.loc[(budget, layer, kv, axis)]
            assert row["out_err"] == pytest.approx(error) and (row["press"], row["ratio"]) == (press, ratio)
            errors[axis] = error
        best = min(errors, key=errors.get)
        assert got.loc[(budget, layer, kv, best), "best"] and got.loc[(budget, layer, kv)]["best"].sum() == 1
    assert "channels" not in got.loc[0.3].index.get_level_values("axis"), "ThinK keeps every value: ≥ half the bytes"


def test_kv_head_errors_average_the_query_heads_of_a_key_value_head() -> None:
    stats = head_rows(np.random.default_rng(1))
    errors = kv_head_errors(stats, AXES_OF, 2).set_index(["press", "ratio", "layer", "kv_head"])
    pick = stats[(stats["press"] == "think") & (stats["ratio"] == 0.5) & (stats["layer"] == 2)]
    assert errors.loc[("think", 0.5, 2, 1), "out_err"] == pytest.approx(pick[pick["head"] >= 2]["out_err"].mean())
    assert errors.loc[("think", 0.5, 2, 1), "axis"] == "channels" and "full" not in errors.index.get_level_values(0)


def test_the_diagnosis_joins_per_key_value_head() -> None:
    axes = best_axes(head_rows(np.random.default_rng(2)), AXES_OF, 2, [0.5])
    diagnosis = pd.DataFrame([{"layer": layer, "head": head, "kv_head": head // 2, "head_type": f"t{head}",
                               "retrieval": 0.1 * head + layer, "local": float(head)}
                              for layer in range(3) for head in range(4)])
    joined = join_diagnosis(axes, diagnosis)
    row = joined[(joined["layer"] == 1) & (joined["kv_head"] == 1)].iloc[0]
    assert row["head_types"] == "t2+t3" and row["retrieval"] == pytest.approx(1.3) and row["local"] == 2.5
    assert len(joined) == len(axes)


def test_summary_counts_the_heads_each_axis_wins() -> None:
    axes = best_axes(head_rows(np.random.default_rng(3)), AXES_OF, 2, [0.5, 0.8])
    table = summary(axes)
    for budget in (0.5, 0.8):
        rows = table[table["budget"] == budget]
        assert rows["best_heads"].sum() == 6 and list(rows["axis"]) == [a for a in AXES if a in set(rows["axis"])]
        chosen = axes[(axes["budget"] == budget) & (axes["axis"] == "tokens")]
        assert rows.set_index("axis").loc["tokens", "median_err"] == pytest.approx(np.median(chosen["out_err"]))


def test_dominant_type_is_the_most_common_query_head_type() -> None:
    """A key/value head's type is its query heads' most common one; a tie goes to the type first by name."""
    found = dominant_type(pd.Series(["sink+sink+mixed", "retrieval+mixed+mixed", "sink+retrieval+local"]))
    assert list(found) == ["sink", "mixed", "local"]


def write_plan(path, budgets: tuple[float, ...]) -> str:
    """A cache_axes.csv whose best rows plan one layer's two key/value heads at each budget."""
    path.mkdir()
    pd.DataFrame([{"budget": budget, "layer": 0, "kv_head": head, "press": "knorm", "ratio": 1 - budget,
                   "best": True} for budget in budgets for head in (0, 1)]).to_csv(path / "cache_axes.csv", index=False)
    return str(path)


def test_a_ratio_plays_the_budget_within_the_tolerance() -> None:
    assert plan_budget([0.3, 0.6], 0.7) == 0.3  # 1 − 0.7 is 0.30000000000000004
    assert plan_budget([0.3, 0.6], 0.4) == 0.6
    assert plan_budget([0.3, 0.6], 0.5) is None and plan_budget([], 0.5) is None


def test_ratios_the_map_lacks_are_refused_in_one_line(tmp_path) -> None:
    run = write_plan(tmp_path / "axes", (0.3, 0.6))
    check_plan_ratios(run, (0.4, 0.7))
    with pytest.raises(SpectraError) as refused:
        check_plan_ratios(run, (0.4, 0.5))
    message = str(refused.value)
    assert "\n" not in message and "budgets of its axis map, 0.3, 0.6 (ratios 0.4,0.7)" in message
    assert "ratios=0.5 asks for 0.5: pass ratios among 0.4,0.7, or map 0.5 first with bytes_kept='0.5'" in message
