"""InfiniteBench's synthetic key–value retrieval (kv_retrieval), asked as several questions of one context.

InfiniteBench (xinrongzhang2022/InfiniteBench, its kv_retrieval data and prompt) hides the pair to retrieve in a JSON
object of random UUID keys mapped to random UUID values, and asks for the value of one key: "Extract the value
corresponding to the specified key in the JSON object below." then the object, then "Key: <key>" and "The value
associated with the specified key is:". Here one context asks for the values of `QUESTIONS` keys, one question each
(kvpress's `questions=[…]`: the object compressed once, without any key in view, every key then asked of that one
cache); the shared answer prefix is InfiniteBench's. `size` counts the object's pairs; the first key asked sits at
`depth` among them, the others at random places. Keys and values are version-4 UUIDs drawn from the example's
generator, written as `json.dumps` writes the object (InfiniteBench's format).
"""

from __future__ import annotations

import json
import random
import uuid

from ..family import Build, GeneratedExample, Family, Target, register
from ..question import numbered

TASK = "Extract the value corresponding to the specified key in the JSON object below.\n\n"
QUESTION, PREFIX = "Key: \"{key}\"\n", "The value associated with the specified key is: "
#: keys asked of one context, each a question of its own
QUESTIONS = 4


def draw(rng: random.Random) -> str:
    """A random version-4 UUID."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class KvFamily(Family):
    name = "kv"
    tasks = {"kv_retrieval": 16}
    max_new_tokens = 50  # InfiniteBench's kv_retrieval

    def minimum(self, task: str) -> int:
        return QUESTIONS

    def builder(self, task: str, target: Target) -> Build:
        return self.build

    def build(self, rng: random.Random, size: int, depth: float) -> GeneratedExample:
        """`size` pairs of random UUIDs; `QUESTIONS` of their keys asked, the first at `depth`."""
        pairs = [(draw(rng), draw(rng)) for _ in range(size)]
        first = min(size - 1, int(size * depth))
        asked = [first] + rng.sample([i for i in range(size) if i != first], QUESTIONS - 1)
        context = TASK + json.dumps(dict(pairs), ensure_ascii=False) + "\n\n"
        return GeneratedExample(context, numbered([QUESTION.format(key=pairs[i][0]) for i in asked],
                                                  [[pairs[i][1]] for i in asked]), PREFIX, depth)


register(KvFamily())
