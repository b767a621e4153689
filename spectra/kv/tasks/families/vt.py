"""RULER's variable tracking (vt): a chain of 5 variable assignments (num_hops 4) hidden in noise lines, after one
worked example; the answers are the chain's variables.

The worked example is RULER's ICL example: the same task with 3-letter variables and as many noise lines as keep its
prompt within 500 of the model's tokens (fitted once per seed); the question's chain has 5-letter variables and
`size` noise lines. RULER's trailing space after each `VAR X = VAR Y` is kept.
"""

from __future__ import annotations

import random
import re
import string

from ..family import Build, GeneratedExample, Family, Target, example_rng, largest_fitting, register
from ..haystack import NOISE

TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
            "Question: Find all variables that are assigned the value {query} in the text above.")
PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {count} variables are "
          "assigned the value {query}, they are: ")
#: hops per chain, and RULER's token budget of the worked example
HOPS, ICL_TOKENS = 4, 500


def chain(rng: random.Random, letters: int, value: str) -> tuple[list[str], list[str]]:
    """(variables, statements) of one chain: VAR A = value, VAR B = VAR A, … (RULER's trailing space kept)."""
    names: list[str] = []
    while len(names) < HOPS + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    statements = [f"VAR {names[0]} = {value}"] + [f"VAR {names[i + 1]} = VAR {names[i]} " for i in range(HOPS)]
    return names, statements


def prompt(rng: random.Random, size: int, letters: int) -> tuple[str, list[str]]:
    """A vt prompt (template + answer prefix) with `size` noise lines, and its chain's variables."""
    value = str(rng.randint(10000, 99999))
    names, statements = chain(rng, letters, value)
    lines = [NOISE] * size
    for offset, at in enumerate(sorted(rng.sample(range(size), len(statements)))):
        lines.insert(at + offset, statements[offset])
    context = "\n".join(lines).replace(". \n", ".\n")
    return (TEMPLATE + PREFIX).format(context=context, query=value, count=HOPS + 1), names


class VtFamily(Family):
    name = "vt"
    tasks = {"vt": 8}
    max_new_tokens = 30
    question_pattern = re.compile(r"Question: Find all variables that are assigned the value")
    answer_pattern = re.compile(r"Answer:")

    def minimum(self, task: str) -> int:
        return HOPS + 1  # the 5 statements go between distinct noise lines

    def icl_size(self, target: Target) -> int:
        """Noise lines of the worked example: the most whose prompt stays within RULER's 500 tokens."""
        def measure(size: int) -> int:
            return target.tokens(prompt(example_rng(target.seed, self.tasks["vt"], 0, 0), size, 3)[0])

        return largest_fitting(measure, ICL_TOKENS, 20, HOPS + 1) or HOPS + 1

    def haystack_type(self, task: str) -> str:
        return "noise"

    def builder(self, task: str, target: Target) -> Build:
        icl_size = self.icl_size(target)
        return lambda rng, size, depth: self.build(rng, size, icl_size)

    def build(self, rng: random.Random, size: int, icl_size: int) -> GeneratedExample:
        """A worked example with `icl_size` noise lines and its answer, then the question's chain in `size` lines."""
        icl, icl_names = prompt(rng, icl_size, 3)
        text, names = prompt(rng, size, 5)
        return self.example(icl + " " + " ".join(icl_names) + "\n" + "\n" + text, names, None)


register(VtFamily())
