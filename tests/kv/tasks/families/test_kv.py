"""kv_retrieval: the context is InfiniteBench's instruction and a JSON object that parses back to the pairs; each
question's answer is the value of the key it asks, recomputed from the parsed object; the first key asked sits at its
depth; the same generator seed builds the same example."""

from __future__ import annotations

import json
import random
import re

import pytest

from spectra.kv.tasks.families.kv import QUESTIONS
from spectra.registry import TASKS

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_each_question_asks_the_value_of_one_key_of_the_object(depth: float, build) -> None:
    example = build("kv_retrieval", 30, depth)
    head, _, rest = example.context.partition("\n\n")
    assert head == "Extract the value corresponding to the specified key in the JSON object below."
    pairs = json.loads(rest)
    assert len(pairs) == 30 and all(UUID.match(key) and UUID.match(value) for key, value in pairs.items())
    keys = [re.fullmatch(r'Key: "(.+)"\n', asked.text).group(1) for asked in example.asked]
    assert len(keys) == len(set(keys)) == QUESTIONS and [asked.index for asked in example.asked] == [0, 1, 2, 3]
    assert [asked.answers for asked in example.asked] == [(pairs[key],) for key in keys]
    assert example.answer_prefix == "The value associated with the specified key is: "
    assert list(pairs).index(keys[0]) == min(29, int(30 * depth)) and example.depth == depth
    assert all(answer in example.context for answer in example.answers)


def test_the_generator_seed_fixes_the_example(build) -> None:
    assert build("kv_retrieval", 12, seed=4) == build("kv_retrieval", 12, seed=4)
    assert build("kv_retrieval", 12, seed=4) != build("kv_retrieval", 12, seed=5)
    family = TASKS["kv_retrieval"]
    assert family.minimum("kv_retrieval") == QUESTIONS and family.max_new_tokens == 50
    assert family.builder("kv_retrieval", None)(random.Random(0), QUESTIONS, 0.5).many
