"""niah: each variant's answers recomputed from its context alone (the needles parsed, the keys asked read from the
question), RULER's wording, the needle at its depth, and which variants read a --haystack file."""

from __future__ import annotations

import re

import pytest

from spectra.registry import TASKS
from spectra.kv.tasks.families.niah import VARIANTS
from spectra.kv.tasks.haystack import NOISE, Haystack

NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: ([0-9a-f-]+)\.")
FILE = Haystack(tuple("Essays are long. They have many sentences! Do they? Yes. ".split() * 40), "file")


def queried(question: str) -> list[str]:
    keys = re.search(r"special magic \w+ for (.+) mentioned in the provided text", question).group(1)
    return re.split(r", and |, ", keys)


@pytest.mark.parametrize("task", list(VARIANTS))
@pytest.mark.parametrize("haystack", [None, FILE])
def test_niah_answers_are_the_values_of_the_keys_asked(task: str, haystack, build) -> None:
    example = build(task, 40, seed=3, haystack=haystack)
    values: dict[str, list[str]] = {}
    for kind, key, value in NEEDLE.findall(example.context):
        values.setdefault(key, []).append(value)
    spec = VARIANTS[task]
    if spec.apart:  # one key a question, each question's answers its key's values
        keys = [queried(asked.text)[0] for asked in example.asked]
        assert [sorted(asked.answers) for asked in example.asked] == [sorted(values[key]) for key in keys]
        assert example.many and example.answer_prefix == " The special magic number for the key asked is"
        assert all(asked.text.startswith("What is the special magic number for ") for asked in example.asked)
        assert example.context.startswith("Some special magic") and len(keys) == len(set(keys)) == spec.queries
        assert len(NEEDLE.findall(example.context)) == spec.keys and example.context.endswith("\n")
        return
    assert not example.many
    keys = queried(example.asked[0].text)
    assert sorted(example.answers) == sorted(value for key in keys for value in values[key])
    assert len(keys) == spec.queries and all(len(values[key]) == spec.values for key in keys)
    one = spec.queries * spec.values == 1
    assert example.context.startswith("A special magic" if one else "Some special magic")
    assert example.asked[0].text.startswith("What is the special" if one else "What are all the special")
    assert example.answer_prefix.endswith(" is" if one else " are")
    if spec.haystack == "needle":
        assert len(NEEDLE.findall(example.context)) == 40 + spec.keys
    elif spec.haystack == "essay" and haystack is not None:
        assert "Essays are long." in example.context and NOISE not in example.context
    else:
        assert example.context.count(NOISE) == 40


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_the_asked_needle_sits_at_its_depth(depth: float, build) -> None:
    example = build("niah_single_1", 50, depth)
    lines = example.context.split("\n")[1:-1]  # the instruction line and the trailing empty one
    at = next(i for i, line in enumerate(lines) if line.startswith("One of"))
    assert at == int(50 * depth) and example.depth == depth


def test_the_essay_variants_read_the_haystack_and_generate_128_tokens() -> None:
    family = TASKS["niah_single_1"]
    assert {task for task in VARIANTS if family.reads_haystack(task)} == {
        "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery",
        "niah_multiquery_questions"}
    assert family.max_new_tokens == 128 and family.metric == "string_match_all" and family.extractive
    assert [TASKS.facts(task)["number"] for task in VARIANTS] == [*range(8), 14, 15]  # the seeds of past task files
