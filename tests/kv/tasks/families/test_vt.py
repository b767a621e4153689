"""vt: the answers are the variables the question's value reaches, recomputed by following the assignments; the
worked example is the largest within RULER's 500 tokens."""

from __future__ import annotations

import random
import re

from spectra.registry import TASKS
from spectra.kv.tasks.families.vt import ICL_TOKENS, prompt
from spectra.kv.tasks.family import Target, example_rng
from spectra.kv.tasks.haystack import NOISE, Haystack


def words(text: str) -> int:
    return len(text.split())


def test_vt_answers_are_the_variables_the_value_reaches(build) -> None:
    example = build("vt", 30)
    value = re.search(r"assigned the value (\d+) in the text above", example.asked[0].text).group(1)
    reached, changed = {value}, True
    while changed:
        changed = False
        for name, source in re.findall(r"VAR ([A-Z]+) = (VAR [A-Z]+|\d+)", example.context):
            source = source.removeprefix("VAR ")
            if source in reached and name not in reached:
                reached.add(name)
                changed = True
    assert set(example.answers) == reached - {value} and len(example.answers) == 5
    assert "they are:  " in example.context  # RULER's worked example and its answer come first
    assert example.asked[0].text.startswith("Question: Find all variables") and TASKS["vt"].max_new_tokens == 30


def test_the_worked_example_is_the_largest_within_500_tokens() -> None:
    family = TASKS["vt"]
    size = family.icl_size(Target(2048, Haystack.noise(), 4, words))
    rng = lambda: example_rng(4, 8, 0, 0)  # noqa: E731 - vt's number 8, length 0, sample 0
    assert words(prompt(rng(), size, 3)[0]) <= ICL_TOKENS < words(prompt(rng(), size + 1, 3)[0])
    assert family.minimum("vt") == 5 and not family.reads_haystack("vt")
    lines = prompt(random.Random(0), 7, 3)[0].split("\n")
    assert sum(line.startswith("VAR ") for line in lines) == 5 and lines.count(NOISE) == 7
