"""Each synthetic task's answers recomputed here from its context alone (the needles parsed, the variable chain
followed, the words counted), and RULER's prompt wording checked."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from spectra.tasks.haystack import NOISE, Haystack
from spectra.tasks.synthetic import NIAH, TASKS, builder, max_new_tokens, word_list

NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: ([0-9a-f-]+)\.")
FILE = Haystack(tuple("Essays are long. They have many sentences! Do they? Yes. ".split() * 40), "file")


def build(task: str, size: int, depth: float = 0.5, seed: int = 1, length: int = 1024, haystack=None):
    return builder(task, haystack or Haystack.noise(), length, 8)(random.Random(seed), size, depth)


def queried(question: str) -> list[str]:
    keys = re.search(r"special magic \w+ for (.+) mentioned in the provided text", question).group(1)
    return re.split(r", and |, ", keys)


@pytest.mark.parametrize("task", list(NIAH))
@pytest.mark.parametrize("haystack", [None, FILE])
def test_niah_answers_are_the_values_of_the_keys_asked(task: str, haystack) -> None:
    example = build(task, 40, seed=3, haystack=haystack)
    values: dict[str, list[str]] = {}
    for kind, key, value in NEEDLE.findall(example.context):
        values.setdefault(key, []).append(value)
    keys = queried(example.question)
    assert sorted(example.answers) == sorted(value for key in keys for value in values[key])
    spec = NIAH[task]
    assert len(keys) == spec.queries and all(len(values[key]) == spec.values for key in keys)
    one = spec.queries * spec.values == 1
    assert example.context.startswith("A special magic" if one else "Some special magic")
    assert example.question.startswith("What is the special" if one else "What are all the special")
    assert example.answer_prefix.endswith(" is" if one else " are")
    if spec.haystack == "needle":
        assert len(NEEDLE.findall(example.context)) == 40 + spec.keys
    elif spec.haystack == "essay" and haystack is not None:
        assert "Essays are long." in example.context and NOISE not in example.context
    else:
        assert example.context.count(NOISE) == 40


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_the_asked_needle_sits_at_its_depth(depth: float) -> None:
    example = build("niah_single_1", 50, depth)
    lines = example.context.split("\n")[1:-1]  # the instruction line and the trailing empty one
    at = next(i for i, line in enumerate(lines) if line.startswith("One of"))
    assert at == int(50 * depth) and example.depth == depth
    key = build("passkey", 4000, depth)
    assert abs(key.context.index("The pass key is") / len(key.context) - depth) < 0.06


def test_vt_answers_are_the_variables_the_value_reaches() -> None:
    example = build("vt", 30)
    value = re.search(r"assigned the value (\d+) in the text above", example.question).group(1)
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
    assert example.question.startswith("Question: Find all variables") and max_new_tokens("vt") == 30


@pytest.mark.parametrize("length, common, rare", [(1024, 6, 1), (4096, 30, 3)])
def test_cwe_answers_are_the_ten_most_common_words(length: int, common: int, rare: int) -> None:
    example = build("cwe", 60, length=length)
    listed = example.context.rsplit("Memorize the ones that appear most often.\n", 1)[1]
    words = re.findall(r"\d+\. (.+?)(?= \d+\. |\n|$)", listed)
    counts = Counter(words)
    assert sorted(counts.values(), reverse=True) == [common] * 10 + [rare] * 50
    assert set(example.answers) == {word for word, count in counts.items() if count == common}


def test_fwe_answers_are_the_three_most_frequent_coded_words() -> None:
    example = build("fwe", 2000, length=2048)
    coded = example.context.split("Find the three most frequently appeared coded words. ", 1)[1].split()
    counts = Counter(word for word in coded if word != "...")
    ranked = [word for word, _ in counts.most_common()]
    assert set(example.answers) == set(ranked[:3]) and counts[ranked[2]] > counts[ranked[3]]
    assert Counter(coded)["..."] > counts[ranked[0]]


def test_passkey_follows_the_landmark_recipe() -> None:
    example = build("passkey", 1000, 0.25)
    key = example.answers[0]
    assert f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n" in example.context
    assert (example.question, example.answer_prefix) == ("What is the pass key? ", "The pass key is")
    assert 1 <= int(key) <= 50000 and max_new_tokens("passkey") == 10
    # the task line, the garbage around the key line (1000 characters) and the key line, each ending in a newline
    assert len(example.context) == len(example.context.split("\n")[0]) + 1000 + 48 + len(key) * 2 + 4


def test_the_same_generator_builds_the_same_example() -> None:
    for task in TASKS:
        assert build(task, 30, seed=5) == build(task, 30, seed=5)
        assert build(task, 30, seed=5) != build(task, 30, seed=6)


def test_cwe_refuses_more_distinct_words_than_the_lists_hold() -> None:
    with pytest.raises(ValueError, match="distinct words"):
        word_list(random.Random(0), 10**6, 1, 1)
