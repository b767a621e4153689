"""Head types by their thresholds, the winner per head, the depth-2 rule and its held-out accuracy, and the
DuoAttention pattern aggregated over each key/value group."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectra.anatomy.methodmap import duo_pattern, grow, head_types, held_out_accuracy, method_map, winners


def test_head_types_follow_the_thresholds_in_order() -> None:
    table = pd.DataFrame({"induction_score": [0.5, 0.5, np.nan, np.nan, np.nan, np.nan, np.nan],
                          "prev": [0.9, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1],
                          "sink_share": [0.9, 0.1, 0.9, 0.6, 0.1, 0.1, 0.1],
                          "local": [0.9, 0.1, 0.9, 0.9, 0.85, 0.1, 0.1],
                          "retrieval": [0.5, 0.0, 0.5, 0.5, 0.5, 0.2, 0.05]})
    assert list(head_types(table)) == ["induction", "induction", "previous-token", "sink", "local", "retrieval",
                                       "mixed"]


def approx_table() -> pd.DataFrame:
    rows = []
    for layer in range(2):
        for head in range(3):
            for method, error in (("a", 0.1 + head), ("b", 0.5 + 0.1 * layer), ("c", 0.9)):
                rows.append({"method": method, "budget": 8, "layer": layer, "head": head, "metric": "out_err",
                             "mean": error})
                rows.append({"method": method, "budget": 8, "layer": layer, "head": head, "metric": "tv",
                             "mean": 1 - error})
    return pd.DataFrame(rows)


def test_the_winner_has_the_smallest_mean_output_error() -> None:
    won = winners(approx_table())
    assert list(won["winner"]) == ["a", "b", "b", "a", "b", "b"]
    first = won.iloc[0]
    assert (first["winner_err"], first["runner_up"], first["runner_up_err"]) == (0.1, "b", 0.5)
    assert first["margin"] == pytest.approx(5)


def test_the_tree_finds_a_separating_split_and_predicts_held_out_heads() -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"local": rng.uniform(size=60), "noise": rng.uniform(size=60)})
    labels = np.where(frame["local"] > 0.6, "window", "pool-mean").astype(object)
    tree = grow(frame, labels, ["noise", "local"])
    assert tree.feature == "local" and 0.5 < tree.threshold < 0.7
    assert (tree.predict(frame) == labels).all()
    assert held_out_accuracy(frame, labels, ["noise", "local"]) > 0.9
    assert grow(frame, np.full(60, "same", dtype=object), ["local"]).feature is None, "nothing to split"


def test_method_map_joins_the_diagnosis_and_reports_the_rule() -> None:
    diagnosis = pd.DataFrame({"layer": [0, 0, 0, 1, 1, 1], "head": [0, 1, 2] * 2,
                              "retrieval": [0.0, 0.3, 0.4, 0.1, 0.35, 0.5], "prev": [0.0] * 6})
    mapped, rules = method_map(diagnosis, approx_table())
    assert list(mapped["winner"]) == ["a", "b", "b", "a", "b", "b"]
    assert (mapped["predicted"] == mapped["winner"]).all(), "retrieval < 0.2 separates a from b"
    assert rules.iloc[0]["accuracy"] == 1 and rules.iloc[0]["baseline"] == pytest.approx(4 / 6)
    assert "retrieval <" in rules.iloc[0]["rule"]


def test_duo_pattern_takes_each_group_s_largest_score_and_keeps_a_share() -> None:
    layers, heads, kv_heads = 2, 9, 3
    scores = np.arange(layers * heads, dtype=float).reshape(layers, heads)[:, ::-1].copy()  # head 0 highest
    layer, head = np.meshgrid(range(layers), range(heads), indexing="ij")
    diagnosis = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "retrieval": scores.ravel()})
    full, table = duo_pattern(diagnosis, layers, heads, kv_heads, share=0.5)
    np.testing.assert_array_equal(table["retrieval"].to_numpy().reshape(2, 3), scores[:, [0, 3, 6]])
    np.testing.assert_array_equal(full.to_numpy(), [[0, 0, 0], [1, 1, 1]])
    assert duo_pattern(diagnosis, layers, heads, kv_heads, share=0.0)[0].to_numpy().sum() == 0
