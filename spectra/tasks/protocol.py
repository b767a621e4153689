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
here). After loading, each example's prompt is
checked against the positions (`TaskSource.start`).
"""

from __future__ import annotations

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


def configured(config: RunConfig) -> RunConfig:
    """The run configuration of a task run: at most the file's examples, one example a batch, the length of the
    longest evaluated record (what the loop and its memory check read before the prompts are built)."""
    records = records_of(config.data)
    samples = min(config.samples, len(records))
    longest = max((record.length for record in records[:samples] if record.length is not None), default=config.length)
    return replace(config, length=max(2, longest), samples=samples, batch_size=1)


def announce(config: RunConfig, reporter: Reporter) -> None:
    """Say when --samples leaves examples of the file out."""
    total = len(records_of(config.data))
    if config.samples < total:
        reporter.notify(f"evaluating the first {config.samples} of the {total} examples of {Path(config.data).name} "
                        "(--samples)")


def source(config: RunConfig, options: Any, where: Any):
    """The loop's source: a `TaskSource` over the evaluated records."""
    from .source import TaskSource

    return TaskSource(config, where, records_of(config.data)[:config.samples], query_aware=options.query_aware,
                      received=bool(PRESSES.having(RECEIVED) & set(options.presses)),
                      windowed=bool(PRESSES.having("windowed") & set(options.presses)))


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
