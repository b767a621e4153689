"""RULER's needle-in-a-haystack tasks (niah_*), as synthetic.yaml sets them.

Needles "One of the special magic {values} for {key} is: {value}." hide in a noise, essay or needle haystack:
single_1/2/3 (one needle; number or uuid values), multikey_1 (3 distractor keys), multikey_2/3 (a haystack of
distractor needles), multivalue (4 values of one key), multiquery (4 keys asked). The first needle asked about sits
at `depth`, the others at random depths; `size` counts noise or needle lines, or essay words. The prompt is RULER's
base template (task template + answer prefix, scripts/data/synthetic/constants.py), in its singular wording when one
value is asked for ('Some' → 'A', 'are all' → 'is', 'are' → 'is'). The essay tasks read `--haystack` (RULER's Paul
Graham essays, downloaded: here local prose, the licence texts Debian ships by default), or RULER's noise when asked
(`--haystack noise`).

Two tasks ask their keys one per question of the same context (kvpress's `questions=[…]`: the context compressed
once, without the questions): `niah_multiquery_questions` is RULER's niah_multiquery with its four keys asked
apart, `niah_multi_questions` hides eight needles in the noise and asks four of them, one a question. Their context
is RULER's up to the question; each question is RULER's singular one for one key ('What is the special magic number
for KEY mentioned in the provided text?'), and the answer prefix, shared by every question as kvpress's pipeline
shares it, names no key (QUESTIONS_PREFIX).
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass

from ..family import Build, GeneratedExample, Family, Target, register
from ..haystack import NOISE, Haystack, insert, niah_words
from ..question import numbered

TEMPLATE = ("Some special magic {values} are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the {values} afterwards.\n{context}\nWhat are all the special magic {values} "
            "for {query} mentioned in the provided text?")
PREFIX = " The special magic {values} for {query} mentioned in the provided text are"
TEMPLATE_ONE = ("A special magic {value} is hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the {value} afterwards.\n{context}\nWhat is the special magic {value} "
                "for {query} mentioned in the provided text?")
PREFIX_ONE = " The special magic {value} for {query} mentioned in the provided text is"
NEEDLE = "One of the special magic {values} for {key} is: {value}."
#: a many-question task's question (RULER's singular one, for one key) and its answer prefix, shared by every question
QUESTION_ONE = "What is the special magic {value} for {query} mentioned in the provided text?"
QUESTIONS_PREFIX = " The special magic {value} for the key asked is"


@dataclass(frozen=True)
class Niah:
    """One niah task's settings (RULER's synthetic.yaml) and its number: the haystack kind, key and value kinds,
    and how many keys, values per key and keys asked."""

    number: int
    haystack: str
    key: str
    value: str
    keys: int = 1
    values: int = 1
    queries: int = 1
    #: each key asked is a question of its own (a many-question record), not one question naming them all
    apart: bool = False


VARIANTS = {
    "niah_single_1": Niah(0, "noise", "words", "numbers"),
    "niah_single_2": Niah(1, "essay", "words", "numbers"),
    "niah_single_3": Niah(2, "essay", "words", "uuids"),
    "niah_multikey_1": Niah(3, "essay", "words", "numbers", keys=4),
    "niah_multikey_2": Niah(4, "needle", "words", "numbers"),
    "niah_multikey_3": Niah(5, "needle", "uuids", "uuids"),
    "niah_multivalue": Niah(6, "essay", "words", "numbers", values=4),
    "niah_multiquery": Niah(7, "essay", "words", "numbers", keys=4, queries=4),
    "niah_multiquery_questions": Niah(14, "essay", "words", "numbers", keys=4, queries=4, apart=True),
    "niah_multi_questions": Niah(15, "noise", "words", "numbers", keys=8, queries=4, apart=True),
}


def draw(rng: random.Random, kind: str) -> str:
    """A random key or value: a 7-digit number, an adjective-noun word, or a version-4 uuid."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjectives, nouns = niah_words()
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class NiahFamily(Family):
    name = "niah"
    tasks = {task: spec.number for task, spec in VARIANTS.items()}
    max_new_tokens = 128
    question_pattern = re.compile(r"What (?:is|are all) the special magic")
    answer_pattern = re.compile(r"The special magic")

    def haystack_type(self, task: str) -> str:
        return VARIANTS[task].haystack

    def builder(self, task: str, target: Target) -> Build:
        return lambda rng, size, depth: self.build(task, rng, size, depth, target.haystack)

    def build(self, task: str, rng: random.Random, size: int, depth: float, haystack: Haystack) -> GeneratedExample:
        """A niah example with `size` haystack units (noise or needle lines, or essay words)."""
        spec = VARIANTS[task]
        keys = [draw(rng, spec.key) for _ in range(max(spec.keys, spec.queries))]
        values = [[draw(rng, spec.value) for _ in range(spec.values)] for _ in keys]
        asked = rng.sample(range(len(keys)), spec.queries)
        needles = [NEEDLE.format(values=spec.value, key=keys[k], value=value) for k in asked for value in values[k]]
        needles += [NEEDLE.format(values=spec.value, key=keys[k], value=value)
                    for k in range(len(keys)) if k not in asked for value in values[k]]
        depths = [depth] + [rng.random() for _ in needles[1:]]
        if spec.haystack == "essay" and haystack.words is not None:
            context = insert(haystack.sentences(size), needles, depths, " ")
        elif spec.haystack == "needle":
            lines = [NEEDLE.format(values=spec.value, key=draw(rng, spec.key), value=draw(rng, spec.value))
                     for _ in range(size)]
            context = insert(lines, needles, depths, "\n")
        else:  # noise, and RULER's essay tasks under --haystack noise
            context = insert([NOISE] * size, needles, depths, "\n")
        queries = [keys[k] for k in asked]
        query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
        if spec.apart:
            text = (TEMPLATE + PREFIX).format(values=spec.value, context=context, query=query)
            opening = self.split(text)[0]
            questions = [QUESTION_ONE.format(value=spec.value[:-1], query=key) for key in queries]
            return GeneratedExample(opening, numbered(questions, [values[k] for k in asked]),
                                    QUESTIONS_PREFIX.format(value=spec.value[:-1]), depth)
        if spec.queries * spec.values == 1:
            text = (TEMPLATE_ONE + PREFIX_ONE).format(value=spec.value[:-1], context=context, query=query)
        else:
            text = (TEMPLATE + PREFIX).format(values=spec.value, context=context, query=query)
        return self.example(text, [value for k in asked for value in values[k]], depth)


register(NiahFamily())
