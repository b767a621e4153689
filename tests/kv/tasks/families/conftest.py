"""Building one example of a registered task, as `spectra tasks` does, with words counted as tokens."""

from __future__ import annotations

import random

import pytest

from spectra.registry import TASKS
from spectra.kv.tasks.family import GeneratedExample, Target
from spectra.kv.tasks.haystack import Haystack


def words(text: str) -> int:
    """A stand-in tokenizer's count: one token a word."""
    return len(text.split())


@pytest.fixture
def build():
    def make(task: str, size: int, depth: float = 0.5, seed: int = 1, length: int = 1024,
             haystack: Haystack | None = None) -> GeneratedExample:
        target = Target(length, haystack or Haystack.noise(), 0, words)
        return TASKS[task].builder(task, target)(random.Random(seed), size, depth)

    return make
