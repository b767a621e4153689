"""cwe: the answers are the ten most common words of the list, counted here; the repeats follow the length."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from spectra.registry import TASKS
from spectra.kv.tasks.families.cwe import word_list


@pytest.mark.parametrize("length, common, rare", [(1024, 6, 1), (4096, 30, 3)])
def test_cwe_answers_are_the_ten_most_common_words(length: int, common: int, rare: int, build) -> None:
    example = build("cwe", 60, length=length)
    listed = example.context.rsplit("Memorize the ones that appear most often.\n", 1)[1]
    words = re.findall(r"\d+\. (.+?)(?= \d+\. |\n|$)", listed)
    counts = Counter(words)
    assert sorted(counts.values(), reverse=True) == [common] * 10 + [rare] * 50
    assert set(example.answers) == {word for word, count in counts.items() if count == common}
    assert example.asked[0].text.startswith("Question: What are the 10 most common words")
    assert TASKS["cwe"].max_new_tokens == 120 and TASKS["cwe"].minimum("cwe") == 10


def test_cwe_refuses_more_distinct_words_than_the_lists_hold() -> None:
    with pytest.raises(ValueError, match="distinct words"):
        word_list(random.Random(0), 10**6, 1, 1)
