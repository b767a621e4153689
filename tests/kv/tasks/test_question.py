"""A record's questions: numbered from 0 with their answers, always at least one; the whole record's answers (one
question's as written, several questions' in order, each once) and whether it asks many."""

from __future__ import annotations

import pytest

from spectra.kv.tasks.family import GeneratedExample
from spectra.kv.tasks.question import Question, numbered
from spectra.kv.tasks.records import TaskRecord


def test_questions_are_numbered_with_their_answers() -> None:
    assert numbered(["a?", "b?"], [["x"], ("y", "z")]) == (Question(0, "a?", ("x",)), Question(1, "b?", ("y", "z")))
    with pytest.raises(ValueError, match="2 questions for 1 lists of answers"):
        numbered(["a?", "b?"], [["x"]])


def test_the_answers_of_a_whole_record() -> None:
    """One question: its answers as written (a repeated answer kept); several: every question's, in order, each once
    (what the needle of the whole record is)."""
    one = GeneratedExample("x y", numbered(["q?"], [["y", "x", "y"]]), "A:", 0.5)
    many = GeneratedExample("x y z", numbered(["q?", "r?", "s?"], [["z", "x"], ["x"], ["y", "z"]]), "A:", 0.5)
    assert (one.answers, one.many) == (("y", "x", "y"), False)
    assert (many.answers, many.many) == (("z", "x", "y"), True)


@pytest.mark.parametrize("build", [lambda: GeneratedExample("x", (), "A:", None),
                                   lambda: TaskRecord("x", (), "A:", 8, "passkey", None, None, 0)])
def test_a_record_asks_at_least_one_question(build) -> None:
    with pytest.raises(ValueError, match="asks at least one question"):
        build()
