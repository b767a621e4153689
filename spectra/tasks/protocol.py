"""`spectra cache --data F.jsonl` on task records: the long-context task protocol, as the cache kind's declarations.

kvpress 0.5.5's `KVPressTextGenerationPipeline` is the reference: the chat-templated context compressed once, the
question + the template's suffix + the answer prefix appended uncompressed at positions after the *original* context
length, greedy decoding up to `max_new_tokens` stopping at EOS. kvpress prefills once per press and ratio; here each
example's context is prefilled once, exactly and in bounded memory (`spectra.prefill`), and every press compresses
that one prefill at every ratio (`probes.tasks.TaskProbe`, decoding by `spectra.decoding`). The full cache is press
'full' at ratio 0 in every run. `query_aware` compresses the context with the question appended (kvpress's evaluation
convention: context + question compressed, question empty).

`kinds.cache.Cache` chooses these declarations when the data is a task file (`wants_tasks`), and `Analysis.job`
builds the loop's job from them as for any kind: the run configuration (`configured`), the checks before the model
loads (`check`), the notice of a partial run (`announce`), the source (`source`: a `TaskSource` over the records), the
probe (`probe`), what run.json records (`meta`) and the memory an example takes (`memory`).

Checked before the model loads, each in one line: every record (`records.read_records` names the line and field of
a missing or malformed field, an unknown task, an empty context or an answer its context lacks), a record's length
beyond the model's positions (when its files tell them), presses that fit on calibration sequences (not supported
here). After loading, each example's prompt is checked against the positions (`TaskSource.start`).

A task file runs whole; `--samples N` evaluates N of its records spread evenly over its tasks and each task's
lengths, drawn with the run's seed (`evaluated`), and says which tasks it leaves out (the notice, run.json's
`data.tasks_left_out` and the printed run).
"""

from __future__ import annotations

import random
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import checkpoints
from ..config import RunConfig
from ..errors import SpectraError, spell
from ..options import identity
from ..reporter import Reporter
from ..registry import PRESSES
from .records import TaskRecord, is_task_file, read_records

#: the fact of presses that read the attention each key received (the prefill computes it only for them)
RECEIVED = "received"


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


def check(options: Any, shape: checkpoints.Shape, data: str) -> None:
    """Refuse what can be refused before the model loads (see the module docstring); every record of the file is
    checked, evaluated or not."""
    records = records_of(data)
    if shape.causal is False:
        raise SpectraError(f"{shape.name} is an encoder: the task protocol decodes answers with a decoder (a causal "
                           "language model, e.g. Llama, Qwen2, SmolLM2)")
    name = Path(data).name
    for record in records:
        if shape.positions is not None and record.length is not None and record.length > shape.positions:
            raise SpectraError(f"{name} line {record.example + 1}: its length {record.length} is beyond the "
                               f"{shape.positions} positions of {shape.name}")
    if options.fit_samples:
        raise SpectraError(f"{spell('--fit-samples')} calibrates presses on text sequences; the task protocol does "
                           f"not take it (loki and lowrank fit on each example's own context without it)")


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


def evaluated(config: RunConfig) -> list[TaskRecord]:
    """The records a run evaluates, in the file's order: every one without --samples (or with as many), else
    `config.samples` of them spread evenly over the file's tasks, each task's share over its lengths, and drawn at
    random within a (task, length) — seeded by the run's seed, so a resumed run evaluates the same records."""
    records = records_of(config.data)
    if config.samples is None or config.samples >= len(records):
        return records
    from ..seeds import Domain, derive_seed

    rng = random.Random(derive_seed(config.seed, Domain.TASK_SAMPLES))
    chosen: list[TaskRecord] = []
    tasks = grouped(records, "task")
    for of_task, share in zip(tasks.values(), spread(config.samples, [len(group) for group in tasks.values()], rng)):
        lengths = grouped(of_task, "length")
        for of_length, count in zip(lengths.values(), spread(share, [len(group) for group in lengths.values()], rng)):
            chosen += rng.sample(of_length, count)
    return sorted(chosen, key=lambda record: record.example)


def grouped(records: list[TaskRecord], field: str) -> dict[Any, list[TaskRecord]]:
    """Records by the value of `field`, in the order the values first appear."""
    groups: dict[Any, list[TaskRecord]] = {}
    for record in records:
        groups.setdefault(getattr(record, field), []).append(record)
    return groups


def left_out(config: RunConfig) -> list[str]:
    """The file's tasks of which --samples evaluates no record, in the file's order."""
    kept = {record.task for record in evaluated(config)}
    return [task for task in dict.fromkeys(record.task for record in records_of(config.data)) if task not in kept]


def configured(config: RunConfig) -> RunConfig:
    """The run configuration of a task run: the records evaluated (`evaluated`), one example a batch, the length of
    the longest evaluated record (what the loop and its memory check read before the prompts are built)."""
    records = evaluated(config)
    longest = max((record.length for record in records if record.length is not None), default=config.length)
    return replace(config, length=max(2, longest), samples=len(records), batch_size=1)


def announce(config: RunConfig, reporter: Reporter) -> None:
    """Say when --samples leaves records of the file out, and which tasks it leaves out whole."""
    total = len(records_of(config.data))
    if config.samples < total:
        missing = left_out(config)
        reporter.notify(f"evaluating {config.samples} of the {total} records of {Path(config.data).name} (--samples), "
                        "spread over its tasks and lengths" +
                        (f"; tasks left out: {', '.join(missing)}" if missing else ""))


def source(config: RunConfig, options: Any, where: Any):
    """The loop's source: a `TaskSource` over the evaluated records."""
    from .source import TaskSource

    return TaskSource(config, where, evaluated(config), query_aware=options.query_aware,
                      received=bool(PRESSES.having(RECEIVED) & set(options.presses)),
                      windowed=bool(PRESSES.having("windowed") & set(options.presses)), left_out=left_out(config))


def probe(config: RunConfig, options: Any, source):
    """A `TaskProbe` over every press and ratio."""
    from ..probes.tasks import TaskProbe

    return TaskProbe(source, options.presses, options.ratios, config.seed, config.samples,
                     options.compression_interval)


def meta(options: Any) -> dict[str, Any]:
    """What run.json records: the options, and that the run is a task run (its read side is `report/tasks.py`)."""
    return {**identity(options), "protocol": "tasks"}


def memory(source) -> float:
    """Bytes an example takes: its prefill's and its full cache's (`TaskSource.prefill_bytes`)."""
    return source.prefill_bytes()
