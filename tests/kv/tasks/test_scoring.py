"""RULER's scores per example, checked against RULER's aggregate formulas written out here independently."""

from __future__ import annotations

import pytest

from spectra.kv.tasks.scoring import metric, postprocess, score, string_match_all, string_match_part


def ruler_all(preds: list[str], refs: list[list[str]]) -> float:
    """RULER's string_match_all over a task: percent of references found per prediction, averaged, 2 decimals."""
    total = 0.0
    for pred, ref in zip(preds, refs):
        total += len([r for r in ref if r.lower() in pred.lower()]) / len(ref)
    return round(100 * total / len(preds), 2)


def ruler_part(preds: list[str], refs: list[list[str]]) -> float:
    """RULER's string_match_part over a task: percent of predictions holding any reference, 2 decimals."""
    hits = [any(r.lower() in pred.lower() for r in ref) for pred, ref in zip(preds, refs)]
    return round(100 * sum(hits) / len(preds), 2)


PREDICTIONS = [" 1234567.", "The numbers are 1234567 and 7654321", "NOTHING", "Apple-Tree, x", "\n 99\x0188 \t"]
REFERENCES = [["1234567"], ["1234567", "7654321", "5555555"], ["1"], ["apple-tree", "y"], ["9988", "66"]]


def test_the_per_example_scores_average_to_rulers_task_scores() -> None:
    cleaned = [postprocess(p) for p in PREDICTIONS]
    alls = [score("niah_multivalue", p, r) for p, r in zip(PREDICTIONS, REFERENCES)]
    parts = [score("qa_1", p, r) for p, r in zip(PREDICTIONS, REFERENCES)]
    assert round(100 * sum(alls) / len(alls), 2) == ruler_all(cleaned, REFERENCES)
    assert round(100 * sum(parts) / len(parts), 2) == ruler_part(cleaned, REFERENCES)
    assert alls == pytest.approx([1.0, 2 / 3, 0.0, 0.5, 0.5])
    assert parts == [1.0, 1.0, 0.0, 1.0, 1.0]


def test_postprocessing_deletes_control_characters_as_kvpress_does() -> None:
    assert postprocess("\n 99\x01 88 \t") == "99 88"
    assert postprocess(" 12\n34 ") == "1234"
    assert score("niah_single_1", "12\n34", ["1234"]) == 1.0  # kvpress joins them (RULER's evaluate.py would not)


def test_the_metric_follows_the_task_family() -> None:
    assert metric("qa_2") == "string_match_part"
    for task in ("niah_single_1", "vt", "cwe", "fwe", "passkey", "qatar"):
        assert metric(task) == "string_match_all"


def test_matching_ignores_case_and_needs_references() -> None:
    assert string_match_all("ABC def", ["abc", "DEF"]) == 1.0
    assert string_match_part("ABC", ["x", "b"]) == 1.0
    with pytest.raises(ValueError):
        string_match_all("x", [])
