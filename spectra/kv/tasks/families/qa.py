"""RULER's question answering (qa_1: SQuAD, qa_2: HotpotQA), read from RULER's prepared files or kvpress's records,
never generated here (their documents are datasets to download). Scored with string_match_part (any reference
answer found); the answers are the datasets', not necessarily strings of the documents."""

from __future__ import annotations

import re

from ..family import Family, register


class QaFamily(Family):
    name = "qa"
    tasks = {"qa_1": 12, "qa_2": 13}
    max_new_tokens = 32
    metric = "string_match_part"
    question_pattern = re.compile(r"Answer the question based on the given documents\.")
    answer_pattern = re.compile(r"Answer:")
    extractive = False


register(QaFamily())
