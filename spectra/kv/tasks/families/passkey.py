"""The landmark-attention passkey (llama/run_test.py): a pass key between two runs of garbage text, at `depth`;
`size` counts the garbage's characters. RULER writes no passkey task: its records are kvpress's, never split from a
RULER prompt."""

from __future__ import annotations

import random

from ..family import Build, GeneratedExample, Family, Target, register
from ..haystack import NOISE
from ..question import numbered

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
        "I will quiz you about the important information there.")
LINE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION, PREFIX = "What is the pass key? ", "The pass key is"


class PasskeyFamily(Family):
    name = "passkey"
    tasks = {"passkey": 11}
    max_new_tokens = 10  # the landmark test's

    def haystack_type(self, task: str) -> str:
        return "noise"

    def builder(self, task: str, target: Target) -> Build:
        return self.build

    def build(self, rng: random.Random, size: int, depth: float) -> GeneratedExample:
        """`size` characters of garbage, cut at `depth` around the pass key line."""
        before = int(size * depth)
        garbage = " ".join([NOISE] * (size // len(NOISE) + 2))
        key = str(rng.randint(1, 50000))
        lines = [TASK, garbage[:before], LINE.format(key=key), garbage[: size - before]]
        return GeneratedExample("\n".join(lines) + "\n", numbered([QUESTION], [[key]]), PREFIX, depth)


register(PasskeyFamily())
