"""Where a ranking comes from: the presses read (the best that evict tokens, and SnapKV) and, per press, the full
cache's answers kept, the failures with a layer that lost the needle, and the needle kept — counted by hand here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectra.report.survival import pooled_evicted, survival, survivors

#: per press at r = 0.5: the six held examples' scores and needle shares kept, and the share of tokens it kept
PRESSES = {"a": ([1, 1, 0, 0, 1, 1], [1.0, 0.8, 0.2, 0.0, 1.0, 0.5], 0.5),
           "b": ([1, 0, 0, 0, 0, 0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], 0.5),
           "snapkv": ([0, 0, 0, 1, 1, 0], [0.0, 0.0, 0.5, 1.0, 1.0, 0.0], 0.5),
           "kivi4": ([1, 1, 1, 1, 1, 1], [1.0] * 6, 1.0)}  # bits only: every token kept
FULL = [1, 1, 1, 1, 1, 0]  # the held task: the full cache answers 5 of 6 (0.83 ≥ 0.8)


def examples() -> pd.DataFrame:
    rows = [{"press": "full", "ratio": 0.0, "example": example, "question": 0, "task": "held", "score": float(score),
             "kept": 1.0, "needle_kept": 1.0} for example, score in enumerate(FULL)]
    rows += [{"press": "full", "ratio": 0.0, "example": 6 + i, "question": 0, "task": "lost", "score": 0.0,
              "kept": 1.0, "needle_kept": 1.0} for i in range(2)]  # a task the full cache never answers
    for press, (scores, needle, kept) in PRESSES.items():
        rows += [{"press": press, "ratio": 0.5, "example": example, "question": 0, "task": "held",
                  "score": float(score), "kept": kept, "needle_kept": share}
                 for example, (score, share) in enumerate(zip(scores, needle))]
        rows += [{"press": press, "ratio": 0.5, "example": 6 + i, "question": 0, "task": "lost", "score": 0.0,
                  "kept": kept, "needle_kept": 0.0} for i in range(2)]
    return pd.DataFrame(rows)


def evicted() -> pd.DataFrame:
    """task_evicted.csv's rows: every example a press scored below the full cache, with the layers that lost the
    whole needle (a's example 2 in layer 4; snapkv's examples 0 and 1 first in layer 1)."""
    lost = {("a", 2): [4], ("a", 3): [], ("b", 1): [], ("b", 2): [0, 3], ("b", 3): [0], ("b", 4): [],
            ("snapkv", 0): [1, 2], ("snapkv", 1): [1], ("snapkv", 2): []}
    return pd.DataFrame([{"press": press, "ratio": 0.5, "example": example, "question": 0, "task": "held",
                          "score": 0.0, "full": 1.0, "evicted": len(layers),
                          "evicted_layers": ",".join(map(str, layers)), "first_evicted": layers[0] if layers else -1}
                         for (press, example), layers in lost.items()])


def needle() -> pd.DataFrame:
    return pd.DataFrame([{"press": press, "ratio": ratio, "layer": 0, "head": 0, "needle_kept": 1.0}
                         for press, ratio in (("full", 0.0), ("a", 0.5), ("b", 0.5), ("snapkv", 0.5),
                                              ("kivi4", 0.5))])


ORDER = pd.DataFrame({"press": ["full", "kivi4", "a", "b", "snapkv"], "rank": [0, 1, 2, 3, 4]})


def test_the_presses_read_are_the_best_that_evict_tokens_and_snapkv() -> None:
    assert survivors(examples(), ORDER, needle(), top=1) == ["a", "snapkv"]  # kivi4 evicts nothing
    assert survivors(examples(), ORDER, needle(), top=3) == ["a", "b", "snapkv"]
    assert survivors(examples(), ORDER, needle(), top=1, reference="tova") == ["a"]
    unrecorded = needle().assign(needle_kept=lambda frame: np.where(frame["press"] == "a", np.nan, 1.0))
    assert survivors(examples(), ORDER, unrecorded, top=1) == ["b", "snapkv"]  # a recorded no needle
    assert survivors(examples(), ORDER, needle(), ratio=0.75) == []


def test_per_press_the_answers_kept_the_failures_that_lost_a_layer_and_the_needle_kept() -> None:
    table = survival(examples(), evicted(), ["a", "snapkv", "b"]).set_index("press")
    # the full cache answers examples 0–4 of the held task; the lost task is left out
    assert list(table["answered"]) == [5, 5, 5]
    assert table.loc["a", ["kept", "failed", "whole_layer", "first_layer"]].tolist() == [3, 2, 1, 4]
    assert table.loc["snapkv", ["kept", "failed", "whole_layer", "first_layer"]].tolist() == [2, 3, 2, 1]
    # b: failures in examples 1–4, two of them with a whole layer lost, both first in layer 0
    assert table.loc["b", ["kept", "failed", "whole_layer", "first_layer"]].tolist() == [1, 4, 2, 0]
    assert table.loc["a", "needle_answered"] == pytest.approx((1.0 + 0.8 + 1.0) / 3)
    assert table.loc["a", "needle_failed"] == pytest.approx((0.2 + 0.0) / 2)
    assert table.loc["snapkv", "needle_answered"] == pytest.approx(1.0)
    assert table.loc["snapkv", "needle_failed"] == pytest.approx(0.5 / 3)
    assert list(table.index) == ["a", "snapkv", "b"]  # in the order asked


def test_a_press_that_never_fails_has_no_layer_and_no_needle_of_failures() -> None:
    table = survival(examples(), evicted(), ["kivi4"]).set_index("press")
    assert table.loc["kivi4", ["kept", "failed", "whole_layer", "first_layer"]].tolist() == [5, 0, 0, -1]
    assert np.isnan(table.loc["kivi4", "needle_failed"])


def test_the_runs_failure_tables_pool_into_one() -> None:
    class Run:  # the one field pooled_evicted reads
        def __init__(self, frame: pd.DataFrame) -> None:
            self.evicted = frame

    frame = evicted()
    pooled = pooled_evicted([Run(frame[frame["press"] == "a"]), Run(frame[frame["press"] != "a"])])
    assert len(pooled) == len(frame) and set(pooled["press"]) == {"a", "b", "snapkv"}
