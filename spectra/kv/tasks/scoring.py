"""RULER's scores of a prediction, per example, as kvpress's evaluation computes them.

RULER (scripts/eval/synthetic/constants.py) scores a task with `string_match_all` (the share of the reference
answers found, case-insensitively, in the prediction) or `string_match_part` (1 when any reference is found): the
qa tasks with the second. Each task family declares its metric (`family.Family.metric`). Its functions average over a task's examples and report percentages rounded to 2
decimals; here they score one example, in [0, 1], unrounded, so the means and bootstrap intervals over examples are
computed from exact per-example scores (`100 * mean` of these equals RULER's number before its rounding).

Before scoring, kvpress's evaluation/benchmarks/ruler/calculate_metrics.py strips the prediction, deletes the
control characters (\\x00-\\x1f) and strips again. RULER's own evaluate.py replaces them by a newline instead;
the two differ only when a control character splits an answer (kvpress's deletion can join "12\\n34" into a match
of "1234"). `postprocess` follows kvpress, since the task protocol is checked against kvpress.

`settled`: a prediction whose score no continuation can change, so decoding may stop there (`--stop-answered`).
Appending text to a prediction keeps its postprocessed form as a prefix (the strips only remove what ends up at either
end; the deletion is per character), so a reference found stays found, and a score of 1 is final — except through
str.lower's one context-dependent rule, the Greek capital sigma's final form, which such a prediction must not hold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .family import family_of

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """The prediction as kvpress scores it: stripped, control characters deleted, stripped again."""
    return _CONTROL.sub("", prediction.strip()).strip()


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """The share of `answers` found in `prediction`, case-insensitively (RULER's string_match_all, one example)."""
    if not answers:
        raise ValueError("string_match_all needs at least one reference answer")
    found = prediction.lower()
    return sum(1.0 for answer in answers if answer.lower() in found) / len(answers)


def string_match_part(prediction: str, answers: Sequence[str]) -> float:
    """1 when any of `answers` is found in `prediction`, case-insensitively, else 0 (RULER's string_match_part)."""
    if not answers:
        raise ValueError("string_match_part needs at least one reference answer")
    found = prediction.lower()
    return max(1.0 if answer.lower() in found else 0.0 for answer in answers)


def metric(task: str) -> str:
    """The name of the metric `task` is scored with: its family's (string_match_all for a family not known)."""
    found = family_of(task)
    return "string_match_all" if found is None else found.metric


def score(task: str, prediction: str, answers: Sequence[str]) -> float:
    """The example's score in [0, 1]: RULER's metric for `task` on kvpress's postprocessed prediction."""
    cleaned = postprocess(prediction)
    if metric(task) == "string_match_part":
        return string_match_part(cleaned, answers)
    return string_match_all(cleaned, answers)


def settled(task: str, prediction: str, answers: Sequence[str]) -> bool:
    """Whether no continuation of `prediction` can change its score: it scores 1 already and holds no capital sigma
    (whose lower case depends on what follows)."""
    return "\u03a3" not in prediction and score(task, prediction, answers) == 1.0
