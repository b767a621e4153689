"""qa: RULER's question answering is read, never generated, scored with string_match_part, its answers not
required in the documents; its prompt splits where kvpress splits it."""

from __future__ import annotations

import pytest

from spectra.registry import TASKS
from spectra.kv.tasks.family import generated
from spectra.kv.tasks.scoring import score

PROMPT = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
          "words.\n\nThe following are given documents.\n\nDocument 1:\nParis is large.\n\n"
          "Answer the question based on the given documents. Only give me the answer and do not output any other "
          "words.\n\nQuestion: Which city is large? Answer:")


def test_qa_is_read_not_generated() -> None:
    family = TASKS["qa_1"]
    assert TASKS["qa_2"] is family and family.max_new_tokens == 32
    assert not family.generated and not {"qa_1", "qa_2"} & set(generated())
    assert family.metric == "string_match_part" and not family.extractive
    with pytest.raises(NotImplementedError, match="read from task files"):
        family.builder("qa_1", None)
    assert score("qa_1", "Paris or Rome", ["Rome", "Madrid"]) == 1.0


def test_the_prompt_splits_at_the_last_question() -> None:
    context, question, prefix = TASKS["qa_1"].split(PROMPT)
    assert context.endswith("Paris is large.\n\n") and question.startswith("Answer the question based")
    assert question.endswith("Question: Which city is large? ") and prefix == "Answer:"
