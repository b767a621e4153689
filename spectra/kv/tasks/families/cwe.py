"""RULER's common words extraction (cwe): a numbered list of words, 10 common ones repeated 30 times and the others
3 times (6 and 1 below 4096 tokens), after one worked example; the answers are the 10 common words. `size` counts
the distinct words listed; the vocabulary is RULER's (wonderwords' nouns, adjectives and verbs)."""

from __future__ import annotations

import random
import re

from ..family import Build, GeneratedExample, Family, Target, register
from ..haystack import common_words

TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
            "list?")
PREFIX = " Answer: The top 10 words that appear most often in the list are:"
#: the common words, and the length from which RULER repeats words more
COMMON, LONG = 10, 4096


def numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def word_list(rng: random.Random, distinct: int, common: int, rare: int) -> tuple[str, list[str]]:
    """A shuffled numbered list of `distinct` words, the first COMMON repeated `common` times and the others `rare`
    times, and the common words."""
    vocabulary = common_words()
    if distinct > len(vocabulary):
        raise ValueError(f"cwe needs {distinct} distinct words; the word lists hold {len(vocabulary)}")
    chosen = rng.sample(vocabulary, distinct)
    listed = chosen[:COMMON] * common + chosen[COMMON:] * rare
    rng.shuffle(listed)
    return numbered(listed), chosen[:COMMON]


class CweFamily(Family):
    name = "cwe"
    tasks = {"cwe": 9}
    max_new_tokens = 120
    question_pattern = re.compile(r"Question: What are the 10 most common words in the above list\?")
    answer_pattern = re.compile(r"Answer:")

    def minimum(self, task: str) -> int:
        return COMMON

    def builder(self, task: str, target: Target) -> Build:
        return lambda rng, size, depth: self.build(rng, size, target.length)

    def build(self, rng: random.Random, size: int, length: int) -> GeneratedExample:
        """A cwe example with `size` distinct words after one worked example (RULER's repeats depend on the
        length)."""
        shots, (common, rare) = ((40, 10, 3), (30, 3)) if length >= LONG else ((20, 3, 1), (6, 1))
        shot_list, shot_answer = word_list(rng, *shots)
        shot = (TEMPLATE + PREFIX).format(context=shot_list) + " " + numbered(shot_answer)
        listed, answer = word_list(rng, max(size, COMMON), common, rare)
        return self.example(shot + "\n" + (TEMPLATE + PREFIX).format(context=listed), answer, None)


register(CweFamily())
