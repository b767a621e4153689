"""The questions a task record asks of its context: one (kvpress's `question=`) or several (`questions=[…]`: the
context compressed once, without any question, then each question answered from that one compressed cache).

A record holds its questions in one tuple, `asked`, always filled: a single question is a tuple of one. kvpress's
pipeline makes no other difference (it turns `question=q` into `questions=[q]`), so neither does spectra; the file
format keeps kvpress's two spellings (`records.TaskRecord.to_json`). Both the generated example
(`family.GeneratedExample`) and the record read from a file (`records.TaskRecord`) ask their questions through
`Asking`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    """One question a record asks of its context: its 0-based `index` within the record's line, its text and its
    accepted answers."""

    index: int
    text: str
    answers: tuple[str, ...]


def numbered(texts: Sequence[str], answers: Sequence[Sequence[str]]) -> tuple[Question, ...]:
    """Questions 0, 1, … of a record: `texts[i]` with its accepted answers `answers[i]`."""
    if len(texts) != len(answers):
        raise ValueError(f"{len(texts)} questions for {len(answers)} lists of answers")
    return tuple(Question(i, text, tuple(accepted)) for i, (text, accepted) in enumerate(zip(texts, answers)))


class Asking:
    """What a record asking `asked` (its questions, in order, at least one) of its context offers as a whole."""

    asked: tuple[Question, ...]

    def __post_init__(self) -> None:
        if not self.asked:
            raise ValueError(f"a {type(self).__name__} asks at least one question")

    @property
    def many(self) -> bool:
        """Whether the record asks more than one question."""
        return len(self.asked) > 1

    @property
    def answers(self) -> tuple[str, ...]:
        """The accepted answers of the record: its question's, or every question's in order, each once — what the
        needle of the whole record is (and what must occur in an extractive family's context)."""
        if not self.many:
            return self.asked[0].answers
        return tuple(dict.fromkeys(answer for asked in self.asked for answer in asked.answers))
