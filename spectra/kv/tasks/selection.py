"""Which records of a task file a run of the task study evaluates (`spectra evaluate`, `kinds/evaluate.py`).

A task file (kvpress's evaluation records, `records.py`) is read once per version of the file and runs whole;
`--tasks` keeps the records of the tasks it names, each with its line number (`of_tasks`: runs of one file pool by
line, and a record's bootstrap weights depend on its line only); `--samples N` evaluates N of those records spread
evenly over their tasks and each task's lengths, drawn with the run's seed (`evaluated`), and the tasks it leaves out
whole are named (`left_out`: the notice, run.json's `data.tasks_left_out`
and the printed run). What the evaluated records' needles hide in is named too (`haystacks`: run.json's `haystacks`
and the run's opening notice). `wants_tasks` tells a task file from a text corpus, so `spectra cache` can hand a task
file to the task study.
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...config import RunConfig
from ...errors import SpectraError
from .family import family_of
from .records import TaskRecord, is_task_file, read_records


def wants_tasks(data: str) -> bool:
    """Whether `spectra cache --data` names a task file: records with kvpress's or RULER's fields, or an empty .jsonl
    (refused as a task file that holds no record, not read as an empty corpus)."""
    path = Path(data)
    if is_task_file(path):
        return True
    try:
        return path.suffix == ".jsonl" and path.is_file() and path.stat().st_size < 2**16 and not path.read_text(
            encoding="utf-8", errors="replace").strip()
    except OSError:
        return False


def records_of(data: str) -> list[TaskRecord]:
    """The task file's records, read once per version of the file (the kind's declarations each ask for them)."""
    path = Path(data)
    try:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        version = None
    return list(_records(str(path), version))


@lru_cache(maxsize=4)
def _records(path: str, version: tuple[int, int] | None) -> tuple[TaskRecord, ...]:
    return tuple(read_records(path))


def spread(count: int, sizes: list[int], rng: random.Random) -> list[int]:
    """`count` items taken from groups of `sizes` as evenly as they allow: every group with items left gets one in
    turn, and when fewer remain than such groups, groups drawn at random get them."""
    taken = [0] * len(sizes)
    while count > 0:
        room = [i for i, size in enumerate(sizes) if taken[i] < size]
        for i in room if count >= len(room) else rng.sample(room, count):
            taken[i] += 1
        count -= min(count, len(room))
    return taken


def of_tasks(records: list[TaskRecord], tasks: tuple[str, ...] | None, name: str) -> list[TaskRecord]:
    """The records of `tasks` (every record where None), in the file's order, each keeping its line (`example`: the
    index runs pool on and the bootstrap weighs by); a task the file does not hold is one line naming those it does."""
    if tasks is None:
        return records
    held = list(dict.fromkeys(record.task for record in records))
    unknown = [task for task in tasks if task not in held]
    if unknown:
        raise SpectraError(f"{name} holds no record of {', '.join(unknown)} (--tasks); its tasks: {', '.join(held)}")
    return [record for record in records if record.task in tasks]


def evaluated(config: RunConfig, tasks: tuple[str, ...] | None = None) -> list[TaskRecord]:
    """The records a run evaluates, in the file's order: those of `tasks` (--tasks; every task where None), all of
    them without --samples (or with as many), else `config.samples` of them spread evenly over their tasks, each
    task's share over its lengths, and drawn at random within a (task, length) — seeded by the run's seed, so a
    resumed run evaluates the same records."""
    records = of_tasks(records_of(config.data), tasks, Path(config.data).name)
    if config.samples is None or config.samples >= len(records):
        return records
    from ...seeds import Domain, derive_seed

    rng = random.Random(derive_seed(config.seed, Domain.TASK_SAMPLES))
    chosen: list[TaskRecord] = []
    tasks = grouped(records, "task")
    for of_task, share in zip(tasks.values(), spread(config.samples, [len(group) for group in tasks.values()], rng)):
        lengths = grouped(of_task, "length")
        for of_length, count in zip(lengths.values(), spread(share, [len(group) for group in lengths.values()], rng)):
            chosen += rng.sample(of_length, count)
    return sorted(chosen, key=lambda record: record.example)


def units(records: list[TaskRecord], query_aware: bool) -> list[TaskRecord]:
    """What a run prefills, one a batch: the records, or under the query-aware protocol every many-question record
    split into one record per question (`TaskRecord.split`), since a compression with the question in view is one
    compression per question; each keeps its line (`example`) and its question's index."""
    if not query_aware:
        return records
    return [part for record in records for part in record.split()]


def grouped(records: list[TaskRecord], field: str) -> dict[Any, list[TaskRecord]]:
    """Records by the value of `field`, in the order the values first appear."""
    groups: dict[Any, list[TaskRecord]] = {}
    for record in records:
        groups.setdefault(getattr(record, field), []).append(record)
    return groups


def left_out(config: RunConfig, tasks: tuple[str, ...] | None = None) -> list[str]:
    """The tasks (of `tasks`, or of the file) of which --samples evaluates no record, in the file's order."""
    kept = {record.task for record in evaluated(config, tasks)}
    chosen = of_tasks(records_of(config.data), tasks, Path(config.data).name)
    return [task for task in dict.fromkeys(record.task for record in chosen) if task not in kept]


def haystacks(records: list[TaskRecord]) -> list[dict[str, Any]]:
    """What the records' needles hide in (run.json's `haystacks`): per haystack, in the order first met, its `name`
    and `sha256` (the records' `haystack` and `haystack_sha256`) and the `tasks` whose records read it, in order; the
    records that do not say (a file written before spectra recorded it, RULER's or kvpress's own) under name None.
    Tasks whose family declares no haystack (cwe, fwe, kv_retrieval, qa) are left out."""
    found: dict[tuple[str | None, str | None], list[str]] = {}
    for record in records:
        family = family_of(record.task)
        if family is not None and family.haystack_type(record.task) is not None:
            tasks = found.setdefault((record.haystack, record.haystack_sha256), [])
            tasks += [] if record.task in tasks else [record.task]
    return [{"name": name, "sha256": sha256, "tasks": tasks} for (name, sha256), tasks in found.items()]


def haystack_notice(found: list[dict[str, Any]]) -> str | None:
    """`haystacks` in a line: "niah_single_2 read /usr/share/common-licenses (sha256 e702fc128a22…); passkey read
    noise (…)"; None when no record has a haystack."""
    parts = []
    for entry in found:
        tasks = ", ".join(entry["tasks"])
        if entry["name"] is None:
            parts.append(f"{tasks}: not recorded (a task file written before spectra named its haystack: its essay "
                         "tasks read RULER's noise unless spectra tasks was given --haystack)")
        else:
            digest = f" (sha256 {entry['sha256'][:12]}…)" if entry["sha256"] else ""
            parts.append(f"{tasks} read {entry['name']}{digest}")
    return "haystacks: " + "; ".join(parts) if parts else None
