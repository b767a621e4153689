"""RULER's synthetic tasks and the landmark-attention passkey, built for one haystack size, needle depth and seed.

Each task turns (random generator, size, depth) into an `Example`: the prompt RULER would write with its base
template (task template + answer prefix, scripts/data/synthetic/constants.py), split into context, question and
answer prefix as kvpress splits RULER's data (records.split_ruler_prompt), and the reference answers. `size` counts
the haystack's units (noise lines, essay words, listed words, garbage characters); `generate.py` searches the
largest size whose prompt fits a length. Tasks follow RULER's synthetic.yaml settings:

- niah_*: needles "One of the special magic {values} for {key} is: {value}." in a noise, essay or needle haystack;
  single_1/2/3 (one needle; number or uuid values), multikey_1 (3 distractor keys), multikey_2/3 (a haystack of
  distractor needles), multivalue (4 values of one key), multiquery (4 keys asked). The first needle asked about
  sits at `depth`; the others at random depths.
- vt: a chain of 5 variable assignments (num_hops 4) hidden in noise lines, after one worked example (RULER's ICL
  example, about 500 tokens, with 3-letter variables); the answers are the chain's variables.
- cwe: a numbered list of words, 10 common ones repeated 30 times and the others 3 times (6 and 1 below 4096
  tokens), after one worked example; the answers are the 10 common words.
- fwe: coded words drawn from a Zipf law (α = 2) over a vocabulary of length/50 words, the most frequent replaced
  by dots; the answers are the next three.
- passkey (landmark attention, llama/run_test.py): a pass key between two runs of garbage text, at `depth`.
"""

from __future__ import annotations

import math
import random
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .haystack import NOISE, Haystack, common_words, insert, niah_words
from .records import split_ruler_prompt

NIAH_TEMPLATE = ("Some special magic {values} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {values} afterwards.\n{context}\nWhat are all the special magic {values} "
                 "for {query} mentioned in the provided text?")
NIAH_PREFIX = " The special magic {values} for {query} mentioned in the provided text are"
#: RULER's singular wording when one value is asked for ('Some' → 'A', 'are all' → 'is', 'are' → 'is')
NIAH_TEMPLATE_ONE = ("A special magic {value} is hidden within the following text. Make sure to memorize it. "
                     "I will quiz you about the {value} afterwards.\n{context}\nWhat is the special magic {value} "
                     "for {query} mentioned in the provided text?")
NIAH_PREFIX_ONE = " The special magic {value} for {query} mentioned in the provided text is"
NEEDLE = "One of the special magic {values} for {key} is: {value}."
VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {count} variables are "
             "assigned the value {query}, they are: ")
CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
                "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
                "list?")
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
                "the dots '....'. What are the three most frequently appeared words in the above coded text?")
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
PASSKEY_TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                "I will quiz you about the important information there.")
PASSKEY_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION, PASSKEY_PREFIX = "What is the pass key? ", "The pass key is"
#: tokens generated per task family (RULER's tokens_to_generate; the landmark passkey test generates 10)
MAX_NEW_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "passkey": 10}
#: vt: hops per chain and RULER's token budget of its worked example; cwe: common words and their repeats
VT_HOPS, VT_ICL_TOKENS = 4, 500
CWE_COMMON, CWE_LONG = 10, 4096
#: the smallest haystack size a task is built with (vt places its 5 statements among distinct noise lines; fwe's
#: third answer appears once from about 27 words on)
MIN_SIZE = {"vt": VT_HOPS + 1, "cwe": CWE_COMMON, "fwe": 30}


@dataclass(frozen=True)
class Example:
    """A built example: kvpress's three prompt parts, the reference answers, and the needle's depth (or None)."""

    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    depth: float | None


@dataclass(frozen=True)
class Niah:
    """One niah variant's settings (RULER's synthetic.yaml): the haystack kind, key and value kinds, and how many
    keys, values per key and keys asked."""

    haystack: str
    key: str
    value: str
    keys: int = 1
    values: int = 1
    queries: int = 1


NIAH = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", keys=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", values=4),
    "niah_multiquery": Niah("essay", "words", "numbers", keys=4, queries=4),
}
#: every task; a task's index here enters its seeds (generate.sample_rng): add new tasks at the end
TASKS = (*NIAH, "vt", "cwe", "fwe", "passkey")


def draw(rng: random.Random, kind: str) -> str:
    """A random key or value: a 7-digit number, an adjective-noun word, or a version-4 uuid."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjectives, nouns = niah_words()
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def split(text: str, task: str, answers: list[str], depth: float | None) -> Example:
    """The example of a RULER prompt (template + answer prefix), split as kvpress splits RULER's data."""
    context, question, answer_prefix = split_ruler_prompt(text, task)
    return Example(context, question, answer_prefix, tuple(answers), depth)


def niah(task: str, rng: random.Random, size: int, depth: float, haystack: Haystack) -> Example:
    """A niah example with `size` haystack units (noise or needle lines, or essay words)."""
    spec = NIAH[task]
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
    else:  # noise, and RULER's essay tasks when no --haystack file is given
        context = insert([NOISE] * size, needles, depths, "\n")
    queries = [keys[k] for k in asked]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    if spec.queries * spec.values == 1:
        template, value = NIAH_TEMPLATE_ONE + NIAH_PREFIX_ONE, spec.value[:-1]
        text = template.format(value=value, context=context, query=query)
    else:
        text = (NIAH_TEMPLATE + NIAH_PREFIX).format(values=spec.value, context=context, query=query)
    return split(text, task, [value for k in asked for value in values[k]], depth)


def chain(rng: random.Random, letters: int, value: str) -> tuple[list[str], list[str]]:
    """(variables, statements) of one vt chain: VAR A = value, VAR B = VAR A, … (RULER's trailing space kept)."""
    names: list[str] = []
    while len(names) < VT_HOPS + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    statements = [f"VAR {names[0]} = {value}"] + [f"VAR {names[i + 1]} = VAR {names[i]} " for i in range(VT_HOPS)]
    return names, statements


def vt_prompt(rng: random.Random, size: int, letters: int) -> tuple[str, list[str]]:
    """A vt prompt (template + answer prefix) with `size` noise lines, and its chain's variables."""
    value = str(rng.randint(10000, 99999))
    names, statements = chain(rng, letters, value)
    lines = [NOISE] * size
    for offset, at in enumerate(sorted(rng.sample(range(size), len(statements)))):
        lines.insert(at + offset, statements[offset])
    context = "\n".join(lines).replace(". \n", ".\n")
    return (VT_TEMPLATE + VT_PREFIX).format(context=context, query=value, count=VT_HOPS + 1), names


def vt(rng: random.Random, size: int, icl_size: int) -> Example:
    """A vt example: a worked example with `icl_size` noise lines and its answer, then the question's chain in
    `size` noise lines."""
    icl, icl_names = vt_prompt(rng, icl_size, 3)
    text, names = vt_prompt(rng, size, 5)
    return split(icl + " " + " ".join(icl_names) + "\n" + "\n" + text, "vt", names, None)


def numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def word_list(rng: random.Random, distinct: int, common: int, rare: int) -> tuple[str, list[str]]:
    """A shuffled numbered list of `distinct` words, the first CWE_COMMON repeated `common` times and the others
    `rare` times, and the common words."""
    vocabulary = common_words()
    if distinct > len(vocabulary):
        raise ValueError(f"cwe needs {distinct} distinct words; the word lists hold {len(vocabulary)}")
    chosen = rng.sample(vocabulary, distinct)
    listed = chosen[:CWE_COMMON] * common + chosen[CWE_COMMON:] * rare
    rng.shuffle(listed)
    return numbered(listed), chosen[:CWE_COMMON]


def cwe(rng: random.Random, size: int, length: int) -> Example:
    """A cwe example with `size` distinct words after one worked example (RULER's repeats depend on the length)."""
    shots, (common, rare) = ((40, 10, 3), (30, 3)) if length >= CWE_LONG else ((20, 3, 1), (6, 1))
    shot_list, shot_answer = word_list(rng, *shots)
    shot = (CWE_TEMPLATE + CWE_PREFIX).format(context=shot_list) + " " + numbered(shot_answer)
    listed, answer = word_list(rng, max(size, CWE_COMMON), common, rare)
    return split(shot + "\n" + (CWE_TEMPLATE + CWE_PREFIX).format(context=listed), "cwe", answer, None)


def fwe(rng: random.Random, size: int, length: int) -> Example:
    """An fwe example of about `size` coded words: word k of the vocabulary appears ⌊size k^-2 / ζ(2)⌋ times."""
    vocabulary_size = max(5, (length - MAX_NEW_TOKENS["fwe"]) // 50)
    vocabulary: set[str] = set()
    while len(vocabulary) < vocabulary_size:
        vocabulary.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    ranked = sorted(vocabulary)
    rng.shuffle(ranked)
    ranked[0] = "..."  # the most frequent word is noise
    zeta2 = math.pi**2 / 6
    coded = [word for k, word in enumerate(ranked, 1) for _ in range(int(size * k**-2.0 / zeta2))]
    rng.shuffle(coded)
    return split((FWE_TEMPLATE + FWE_PREFIX).format(context=" ".join(coded)), "fwe", ranked[1:4], None)


def passkey(rng: random.Random, size: int, depth: float) -> Example:
    """A passkey example: `size` characters of garbage, cut at `depth` around the pass key line."""
    before = int(size * depth)
    garbage = " ".join([NOISE] * (size // len(NOISE) + 2))
    key = str(rng.randint(1, 50000))
    lines = [PASSKEY_TASK, garbage[:before], PASSKEY_LINE.format(key=key), garbage[: size - before]]
    return Example("\n".join(lines) + "\n", PASSKEY_QUESTION, PASSKEY_PREFIX, (key,), depth)


def builder(task: str, haystack: Haystack, length: int, icl_size: int) -> Callable[[random.Random, int, float],
                                                                                  Example]:
    """The function (rng, size, depth) → Example of `task` at a target length."""
    if task in NIAH:
        return lambda rng, size, depth: niah(task, rng, size, depth, haystack)
    return {
        "vt": lambda rng, size, depth: vt(rng, size, icl_size),
        "cwe": lambda rng, size, depth: cwe(rng, size, length),
        "fwe": lambda rng, size, depth: fwe(rng, size, length),
        "passkey": lambda rng, size, depth: passkey(rng, size, depth),
    }[task]


def max_new_tokens(task: str) -> int:
    """Tokens the task generates: RULER's tokens_to_generate of its family, 10 for passkey."""
    return MAX_NEW_TOKENS[task.split("_")[0]]
