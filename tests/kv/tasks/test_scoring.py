"""RULER's scores per example, checked against RULER's aggregate formulas written out here independently."""

from __future__ import annotations

import pytest

from spectra.kv.tasks.scoring import metric, postprocess, score, settled, string_match_all, string_match_part


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


def test_a_settled_prediction_scores_1_after_any_continuation() -> None:
    """`--stop-answered` ends an answer once `settled`: whatever text follows (spaces, control characters that
    kvpress's postprocessing deletes and could join, more words), the score stays 1; an answer missing a
    reference, or holding a capital sigma (whose lower case depends on what follows), is not settled."""
    import random
    pieces = ["12", "34", " ", "\n", "\t", "\x01", "ab", "AB", ".", "Σ", "x", "1234", "ß"]
    rng = random.Random(0)
    checked = 0
    for _ in range(4000):
        prediction = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        references = [rng.choice(["1234", "ab", "12 34", "x."])] + ([rng.choice(["34", "b1"])] if rng.random() < .5 else [])
        for task in ("niah_multivalue", "qa_1"):
            if settled(task, prediction, references):
                checked += 1
                for _ in range(5):
                    more = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
                    assert score(task, prediction + more, references) == 1.0, (prediction, more, references)
    assert checked > 200
    assert settled("niah_single_1", " 1234.", ["1234"]) and not settled("niah_multivalue", "1234", ["1234", "5"])
    assert settled("qa_1", "1234", ["1234", "5"]) and not settled("niah_single_1", "ΟΔΟΣ 1234", ["1234"])
    assert score("niah_single_1", "ΟΔΟΣ", ["οδοσ"]) == 0.0 < score("niah_single_1", "ΟΔΟΣX", ["οδοσ"])
