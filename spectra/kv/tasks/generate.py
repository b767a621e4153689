"""`spectra tasks`: task files of RULER's synthetic tasks, passkey and kv_retrieval, fitted to lengths in the model's
own tokens.

A length L is what RULER's prepare.py calls max_seq_length: the example's input tokens plus the tokens it may
generate fit in L. The input is counted as the task protocol (and kvpress's pipeline) will see it: the context in
the model's chat template, then question + answer prefix (prompt.py). Like RULER, the haystack's size is searched
(here per example, starting from the previous example's size) for the largest one that fits. Needle depths are
spread evenly over the samples of a (task, length): 0, 1/(N−1), …, 1 (0.5 for one sample). Every draw is seeded by
(seed, Domain.TASKS, task number, length, sample), so a task file does not depend on which other tasks or lengths
were asked for. Every reference answer must appear in its context, else the example is refused. A family asking
several questions of one context (kvpress's `questions=[…]`) is fitted so that its longest question fits.

The tasks RULER hides in its essays read prose (`choose_haystack`: the licence texts Debian ships unless `--haystack`
names files, or `noise`); the others read what RULER gives them (noise lines, distractor needles). Each record names
its haystack and the sha256 of its text (`haystack_of`). A text the contexts exhaust repeats, as RULER repeats its
essays (a note says how often), up to `MOST_REPEATS` times: more is a paragraph repeated, as the noise is, and refused.

Only the tokenizer and the model's config are read: the weights are never loaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import SpectraError, spell
from ...inputs import items
from ...registry import TASKS
from .family import (Family, GeneratedExample, Target, example_rng, generated, haystack_tasks, largest_fitting,
                     listing)
from . import haystack as stacks
from .haystack import NOISE_NAME, Haystack
from .prompt import prompt_length
from .records import TaskRecord

#: haystack units added to the smallest size to estimate the tokens one unit costs
PROBE = 64
#: the most times a haystack text may repeat to fill the contexts (more: a paragraph repeated, as RULER's noise is)
MOST_REPEATS = 10


@dataclass(frozen=True)
class Fitted:
    """A generated record, the haystack size it was built with and its length in tokens (generation included)."""

    record: TaskRecord
    size: int
    tokens: int


def parse_tasks(text: str | Sequence[str]) -> tuple[str, ...]:
    """Task names from "a,b,c" (or a list), in order, duplicates dropped; "all" is every task."""
    names = items(text, spell("--tasks", "tasks")) if isinstance(text, str) else [name.strip() for name in text]
    tasks = generated()
    if names == ["all"]:
        return tasks
    unknown = [name for name in names if name not in tasks]
    if unknown or not names:
        raise SpectraError(f"unknown task {', '.join(unknown) or '(none given)'} in {spell('--tasks', 'tasks')}; "
                           f"the tasks are {', '.join(tasks)} (or all)")
    return tuple(dict.fromkeys(names))


def parse_lengths(text: str | Sequence[int]) -> tuple[int, ...]:
    """Lengths in tokens from "1024,2048" (or a list), each ≥ 1."""
    parts = items(text, spell("--length", "lengths")) if isinstance(text, str) else list(text)
    try:
        lengths = tuple(int(part) for part in parts)
    except (TypeError, ValueError):
        raise SpectraError(f"{spell('--length', 'lengths')} takes token counts such as 1024,2048; got {text}") from None
    if not lengths or any(length < 1 for length in lengths):
        raise SpectraError(f"{spell('--length', 'lengths')} takes token counts ≥ 1; got {text}")
    return tuple(dict.fromkeys(lengths))


def depths(samples: int) -> list[float]:
    """Needle depths spread evenly over [0, 1]: 0, 1/(N−1), …, 1 (0.5 for one sample)."""
    return [0.5] if samples == 1 else [i / (samples - 1) for i in range(samples)]


def sample_rng(seed: int, task: str, length: int, sample: int) -> random.Random:
    """The generator of one example (seeded by the task's number): fresh for every size tried, so a size always
    builds the same example."""
    return example_rng(seed, TASKS.facts(task)["number"], length, sample)


def check_answers(example: GeneratedExample, task: str, length: int, sample: int) -> None:
    """Refuse an example whose context lacks one of its answers (the task could not be solved)."""
    for answer in example.answers:
        if answer not in example.context:
            raise SpectraError(f"{task} at length {length}, sample {sample}: the answer '{answer}' is not in its "
                               "context; the example is refused")


def haystack_of(task: str, haystack: Haystack) -> dict[str, str | None]:
    """What `task`'s needles hide in, given the essay stand-in `haystack` (the records' `haystack` and
    `haystack_sha256`): the stand-in for an essay task, RULER's noise for a noise task, "needle" (distractors drawn
    with the example: no text to hash) for a needle task, nothing for a task with no haystack."""
    kind = TASKS[task].haystack_type(task)
    used = {"essay": haystack, "noise": Haystack.noise()}.get(kind or "")
    if used is not None:
        return {"haystack": used.name, "haystack_sha256": used.sha256}
    return {"haystack": kind, "haystack_sha256": None}


def fit_task(tokenizer, task: str, length: int, samples: int, seed: int, haystack: Haystack,
             start: int = 0) -> list[Fitted]:
    """`samples` examples of `task`, each with the largest haystack that fits `length`."""
    family: Family = TASKS[task]
    named = haystack_of(task, haystack)
    build = family.builder(task, Target(length, haystack, seed,
                                        lambda text: len(tokenizer.encode(text, add_special_tokens=False))))
    new_tokens = family.max_new_tokens
    minimum = family.minimum(task)
    fitted = []
    for sample, depth in enumerate(depths(samples)):
        built: dict[int, tuple[GeneratedExample, int]] = {}

        def measure(size: int) -> int:
            if size not in built:
                try:
                    example = build(sample_rng(seed, task, length, sample), size, depth)
                except ValueError as error:  # cwe: more distinct words than the word lists hold
                    raise SpectraError(f"{task} at length {length}: {error}") from None
                built[size] = (example, max(prompt_length(tokenizer, example.context, asked.text,
                                                          example.answer_prefix, new_tokens)
                                            for asked in example.asked))
            return built[size][1]

        if not start:
            base = measure(minimum)
            per_unit = max((measure(minimum + PROBE) - base) / PROBE, 1e-3)
            start = minimum + max(0, int((length - base) / per_unit))
        size = largest_fitting(measure, length, start, minimum)
        if size is None:
            raise SpectraError(f"{spell('--length', 'lengths')} {length} is too short for {task}: its smallest "
                               f"example takes {built[minimum][1]} tokens with the model's chat template and "
                               f"{new_tokens} generated tokens")
        example, tokens = built[size]
        check_answers(example, task, length, sample)
        record = TaskRecord(example.context, example.asked, example.answer_prefix, new_tokens, task, length,
                            example.depth, 0, **named)
        fitted.append(Fitted(record, size, tokens))
        start = size
    return fitted


def generate(tokenizer, tasks: Sequence[str], lengths: Sequence[int], samples: int, seed: int = 0,
             haystack: Haystack | None = None,
             progress: Callable[[str, int, list[Fitted]], None] | None = None) -> list[Fitted]:
    """Every (task, length, sample) in that order; `example` is the record's index in the list (its line in the
    file). `progress(task, length, fitted)` is called after each (task, length). The essay tasks read `haystack`
    (by default `choose_haystack`'s: the licence texts)."""
    if samples < 1:
        raise SpectraError(f"{spell('--samples', 'samples')} must be ≥ 1, got {samples}")
    haystack = haystack or choose_haystack(None, tasks)
    found: list[Fitted] = []
    for task in tasks:
        for length in lengths:
            fitted = fit_task(tokenizer, task, length, samples, seed, haystack)
            if progress is not None:
                progress(task, length, fitted)
            found += fitted
    return [dataclasses.replace(item, record=dataclasses.replace(item.record, example=i))
            for i, item in enumerate(found)]


def haystack_paths(given: str | Path | Sequence[str | Path]) -> list[str | Path]:
    """The paths of --haystack: a string comma-separated ("a.txt,b.txt"; the option repeated gives several), a Path
    as it is; refused when none is named."""
    parts = [given] if isinstance(given, (str, Path)) else list(given)
    paths = [path for part in parts
             for path in (items(part, spell("--haystack", "haystack")) if isinstance(part, str) else [part])]
    if not paths:
        raise SpectraError(f"{spell('--haystack', 'haystack')} names no file: give text files (comma-separated), a "
                           "folder of them, or noise")
    return paths


def choose_haystack(given: str | Path | Sequence[str | Path] | None, tasks: Sequence[str]) -> Haystack:
    """The essay stand-in `tasks` read: the files or folders `given` (`haystack_paths`), RULER's noise if `given` is
    "noise", else by default the licence texts Debian ships (`Haystack.licences`) — refused in one line on a
    machine without them rather than silently noise, since the default would then measure another task. RULER's
    noise when no task reads one (and a `given` that none reads is refused: `check_haystack`)."""
    paths = None if given is None else haystack_paths(given)
    check_haystack(tasks, paths is not None)
    reading = [task for task in tasks if TASKS.facts(task)["haystack"]]
    if not reading:
        return Haystack.noise()
    flag, noise = spell("--haystack", "haystack"), spell("--haystack noise", 'haystack="noise"')
    if paths is None:
        found = Haystack.licences()
        if found is None:
            raise SpectraError(f"{listing(tuple(reading))} hide their needles in prose: by default the licence texts "
                               f"Debian systems ship ({stacks.LICENCES}), which this machine lacks; pass "
                               f"{spell('--haystack FILE', 'haystack=FILE')} (any local text, several "
                               f"comma-separated) or {noise} (RULER's noise sentence repeated)")
        return found
    if NOISE_NAME in map(str, paths):
        if len(paths) > 1:
            raise SpectraError(f"{flag} noise is RULER's noise haystack and takes no files beside it: give either "
                               "noise or text files")
        return Haystack.noise()
    return Haystack.from_files(paths)


def check_haystack(tasks: Sequence[str], given: bool) -> None:
    """A --haystack file that none of `tasks` reads would change nothing: refuse it, naming the tasks that read one."""
    if given and not any(TASKS.facts(task)["haystack"] for task in tasks):
        flag = spell("--haystack", "haystack")
        raise SpectraError(f"{flag} is read only by {listing(haystack_tasks())}, and none of the tasks asked for "
                           f"({', '.join(tasks)}) is one of them: drop {flag} (their haystack is RULER's noise) or "
                           f"ask for a task that reads it")


def repeating(fitted: Sequence[Fitted], haystack: Haystack) -> tuple[str, int]:
    """(the tasks whose contexts repeat the haystack text, comma-separated; the most times one does: 1 for none)."""
    if haystack.words is None:
        return "", 1
    found = [item for item in fitted if TASKS.facts(item.record.task)["haystack"] and haystack.repeats(item.size) > 1]
    return (", ".join(dict.fromkeys(item.record.task for item in found)),
            max((haystack.repeats(item.size) for item in found), default=1))


def check_repeats(fitted: Sequence[Fitted], haystack: Haystack) -> None:
    """Refuse a haystack text the contexts would repeat more than `MOST_REPEATS` times (before anything is written)."""
    tasks, most = repeating(fitted, haystack)
    if most > MOST_REPEATS:
        flag = spell("--haystack", "haystack")
        raise SpectraError(f"the haystack {haystack.name} holds {len(haystack.words or ())} words: the contexts of "
                           f"{tasks} would repeat it {most} times, a paragraph repeated as RULER's noise is (at most "
                           f"{MOST_REPEATS} repeats are taken); give a longer text or several files ({flag} "
                           f"a.txt,b.txt), or {flag} noise")


def haystack_note(fitted: Sequence[Fitted], haystack: Haystack) -> str | None:
    """What to say when the examples took more words than the haystack text holds, so it repeats in them (as
    RULER repeats its essays); None when nothing repeats."""
    tasks, most = repeating(fitted, haystack)
    if most == 1:
        return None
    return (f"the haystack {haystack.name} holds {len(haystack.words)} words: the contexts of {tasks} repeat it up to "
            f"{most} times (a text longer than the contexts repeats nothing)")


def write_records(path: str | Path, records: Sequence[TaskRecord]) -> Path:
    """Write records as jsonl (kvpress's fields plus length, depth and haystack), through a temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
    os.replace(partial, path)
    return path
