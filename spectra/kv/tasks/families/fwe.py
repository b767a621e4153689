"""RULER's frequent words extraction (fwe): coded words drawn from a Zipf law (α = 2) over a vocabulary of
length/50 words, the most frequent replaced by dots; the answers are the next three. `size` counts the coded words
(about: word k of the vocabulary appears ⌊size k^-2 / ζ(2)⌋ times)."""

from __future__ import annotations

import math
import random
import re
import string

from ..family import Build, GeneratedExample, Family, Target, register

TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
            "the dots '....'. What are the three most frequently appeared words in the above coded text?")
PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"


class FweFamily(Family):
    name = "fwe"
    tasks = {"fwe": 10}
    max_new_tokens = 50
    question_pattern = re.compile(r"Question: Do not provide any explanation\.")
    answer_pattern = re.compile(r"Answer:")

    def minimum(self, task: str) -> int:
        return 30  # the third answer appears once from about 27 words on

    def builder(self, task: str, target: Target) -> Build:
        return lambda rng, size, depth: self.build(rng, size, target.length)

    def build(self, rng: random.Random, size: int, length: int) -> GeneratedExample:
        """An fwe example of about `size` coded words over a vocabulary of (length − max_new_tokens) / 50 words."""
        vocabulary_size = max(5, (length - self.max_new_tokens) // 50)
        vocabulary: set[str] = set()
        while len(vocabulary) < vocabulary_size:
            vocabulary.add("".join(rng.choices(string.ascii_lowercase, k=6)))
        ranked = sorted(vocabulary)
        rng.shuffle(ranked)
        ranked[0] = "..."  # the most frequent word is noise
        zeta2 = math.pi**2 / 6
        coded = [word for k, word in enumerate(ranked, 1) for _ in range(int(size * k**-2.0 / zeta2))]
        rng.shuffle(coded)
        return self.example((TEMPLATE + PREFIX).format(context=" ".join(coded)), ranked[1:4], None)


register(FweFamily())
