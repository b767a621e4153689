"""What a task family is: everything spectra knows of a family of long-context tasks, declared once, in one file of
spectra/tasks/families/ (lm-evaluation-harness's task is the model).

A family (niah, vt, cwe, fwe, passkey, qa) is a `Family` subclass declaring

- `name` and `tasks`: its task names (each starting with the family's name and "_", or the name itself) and each
  task's number, which enters the seeds of its generated examples (never renumber a task; a new one takes a number
  no other task has) and orders the listings;
- `question_pattern`, `answer_pattern`: where a RULER prompt's question and answer prefix begin (kvpress's split of
  RULER's data); None for a family RULER does not write (passkey);
- `max_new_tokens`: the tokens an answer may take (RULER's tokens_to_generate);
- `metric`: RULER's score of a prediction, `string_match_all` or `string_match_part` (`scoring.py`);
- `extractive`: whether every reference answer is a string of the context (a record whose answer is not is
  refused when the file is read);
- `haystack_type(task)`: what the task hides its needles in, RULER's type_haystack (synthetic.yaml): `essay` (a
  `--haystack` text: RULER's Paul Graham essays), `noise` (RULER's noise sentence repeated), `needle` (distractor
  needles), or None (a context of no haystack: word lists, JSON); `reads_haystack(task)`: whether it is `essay`;
- `builder(task, target)`: the generator of the task's examples at a target length,
  `(rng, size, depth) → GeneratedExample`, asking one question or several of one context (a family without a
  builder is read from files, never generated), and `minimum(task)`, the smallest size it builds;

and ends with `register(TheFamily())`. `registry.TASKS` imports the family files when it is first listed (they are
torch-free and cheap), so `spectra tasks --help` lists the tasks and a task file's names are checked before any
model loads. Adding a family is its file and its test.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from ...errors import SpectraError
from ...registry import TASKS
from .haystack import Haystack
from .question import Asking, Question, numbered

#: RULER's metrics (scripts/eval/synthetic/constants.py), by name
METRICS = ("string_match_all", "string_match_part")
#: RULER's haystack types (synthetic.yaml's type_haystack): essays (here a --haystack text), noise, needles
HAYSTACK_TYPES = ("essay", "noise", "needle")


@dataclass(frozen=True)
class GeneratedExample(Asking):
    """A generated example (a family's builder's, before it becomes a `records.TaskRecord`; not `examples.Example`,
    a record tokenized to run): its context, the questions it `asked` (`question.Question`: one, or several of one
    context — kvpress's `questions=[…]`), the answer prefix after each, and the needle's depth (or None); `answers`
    are every question's (`question.Asking`)."""

    context: str
    asked: tuple[Question, ...]
    answer_prefix: str
    depth: float | None


@dataclass(frozen=True)
class Target:
    """What examples are generated for: the `length` in tokens, the `haystack`, the run's `seed`, and `tokens`, the
    model tokenizer's count of a text's tokens (no special tokens), for families that fit a part of their prompt."""

    length: int
    haystack: Haystack
    seed: int
    tokens: Callable[[str], int]


#: one generated example from (its generator, the haystack size, the needle's depth)
Build = Callable[[random.Random, int, float], GeneratedExample]


class Family:
    """A family of tasks (see the module docstring); subclasses declare what differs."""

    name: ClassVar[str]
    tasks: ClassVar[Mapping[str, int]]
    max_new_tokens: ClassVar[int]
    metric: ClassVar[str] = "string_match_all"
    question_pattern: ClassVar[re.Pattern[str] | None] = None
    answer_pattern: ClassVar[re.Pattern[str] | None] = None
    extractive: ClassVar[bool] = True

    def haystack_type(self, task: str) -> str | None:
        """RULER's type_haystack of `task`: one of `HAYSTACK_TYPES`, or None where its context is no haystack."""
        return None

    def reads_haystack(self, task: str) -> bool:
        """Whether `task` hides its needles in a --haystack text (RULER's essays)."""
        return self.haystack_type(task) == "essay"

    def minimum(self, task: str) -> int:
        """The smallest haystack size `task` is built with."""
        return 1

    def builder(self, task: str, target: Target) -> Build:
        """The function (rng, size, depth) → GeneratedExample of `task` at `target`; `size` counts the haystack's
        units."""
        raise NotImplementedError(f"the {self.name} tasks are read from task files, not generated")

    @property
    def generated(self) -> bool:
        """Whether `spectra tasks` generates this family's tasks."""
        return type(self).builder is not Family.builder

    def split(self, text: str) -> tuple[str, str, str]:
        """(context, question, answer_prefix) of a RULER prompt, split as kvpress's create_huggingface_dataset
        does: the context ends where the last question pattern begins, the answer prefix starts at the answer
        pattern after it."""
        if self.question_pattern is None or self.answer_pattern is None:
            raise SpectraError(f"RULER writes no {self.name} task: its prompts cannot be split")
        found = list(self.question_pattern.finditer(text))
        if not found:
            raise SpectraError(f"the RULER prompt has no question of a {self.name} task "
                               f"('{self.question_pattern.pattern}')")
        context, rest = text[: found[-1].start()], text[found[-1].start():]
        prefix = self.answer_pattern.search(rest)
        if prefix is None:
            raise SpectraError(f"the RULER prompt has no answer prefix of a {self.name} task "
                               f"('{self.answer_pattern.pattern}')")
        return context, rest[: prefix.start()], rest[prefix.start():]

    def example(self, text: str, answers: list[str], depth: float | None) -> GeneratedExample:
        """The example of a RULER prompt (template + answer prefix), split as kvpress splits RULER's data."""
        context, question, answer_prefix = self.split(text)
        return GeneratedExample(context, numbered([question], [answers]), answer_prefix, depth)


def register(family: Family) -> Family:
    """Register every task of `family` in `registry.TASKS` (refusing a task outside the family's name or a number
    another task has), with the facts listings and checks read: its family, number, haystack and generation."""
    if family.metric not in METRICS:
        raise ValueError(f"task family '{family.name}': metric '{family.metric}' is not one of {', '.join(METRICS)}")
    for task in family.tasks:
        if family.haystack_type(task) not in (*HAYSTACK_TYPES, None):
            raise ValueError(f"task '{task}': haystack type '{family.haystack_type(task)}' is not one of "
                             f"{', '.join(HAYSTACK_TYPES)} (or None)")
    for task, number in family.tasks.items():
        if task != family.name and not task.startswith(family.name + "_"):
            raise ValueError(f"task '{task}' of the family '{family.name}' must be named '{family.name}_…'")
        taken = {entry.facts["number"]: name for name, entry in TASKS.entries().items()}
        if number in taken:
            raise ValueError(f"task '{task}' takes the number {number} of the task '{taken[number]}'; the numbers "
                             f"taken are {', '.join(map(str, sorted(taken)))}")
        TASKS.add(task, family, family=family.name, number=number, haystack=family.reads_haystack(task),
                  generated=family.generated)
    return family


def family_of(task: str) -> Family | None:
    """The family of a task name: a registered task's, else the family named by the part before the first "_"
    (kvpress groups tasks so: niah_single_1 → niah, a record's own qa_squad → qa); None for an unknown family."""
    if task in TASKS.entries():
        return TASKS[task]
    names = TASKS.groups("family").get(task.split("_")[0])
    return TASKS[names[0]] if names else None


def families() -> tuple[str, ...]:
    """Every family's name, in the order of their tasks' numbers."""
    return tuple(TASKS.groups("family"))


def generated() -> tuple[str, ...]:
    """The tasks `spectra tasks` generates, by number."""
    return tuple(sorted(TASKS.having("generated"), key=lambda task: TASKS.facts(task)["number"]))


def haystack_tasks() -> tuple[str, ...]:
    """The tasks that read a --haystack file, by number."""
    return tuple(task for task in generated() if TASKS.facts(task)["haystack"])


def listing(tasks: tuple[str, ...]) -> str:
    """Task names for --help, tasks numbered alike written once: niah_single_1/2/3, niah_multikey_1/2/3, vt."""
    parts: list[str] = []
    for task in tasks:
        stem, _, number = task.rpartition("_")
        if parts and number.isdigit() and parts[-1].startswith(stem + "_") and \
                parts[-1][len(stem) + 1:].replace("/", "").isdigit():
            parts[-1] += "/" + number
        else:
            parts.append(task)
    return ", ".join(parts)


def example_rng(seed: int, number: int, length: int, sample: int) -> random.Random:
    """The generator of one example of task `number` (seed, Domain.TASKS, number, length, sample): fresh for every
    size tried, so a size always builds the same example."""
    from ...seeds import Domain, derive_seed

    return random.Random(derive_seed(seed, Domain.TASKS, number, length, sample))


def largest_fitting(measure: Callable[[int], int], length: int, start: int, minimum: int) -> int | None:
    """The largest size ≥ `minimum` with measure(size) ≤ `length` found by galloping from `start`, then bisecting
    (token counts grow with the size, up to the noise of the draws: the size found fits, and size + 1 does not);
    None when even `minimum` does not fit."""
    if measure(minimum) > length:
        return None
    size = max(start, minimum)
    step = max(1, size // 16)
    if measure(size) <= length:
        low, high = size, None
        while high is None:
            if measure(low + step) <= length:
                low, step = low + step, step * 2
            else:
                high = low + step
    else:
        low, high = minimum, size
        while high - step > minimum:
            if measure(high - step) <= length:
                low = high - step
                break
            high, step = high - step, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if measure(middle) <= length else (low, middle)
    return low
