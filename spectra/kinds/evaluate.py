"""`spectra evaluate MODEL --data F.jsonl`: the task study — what a decoder can still answer from a compressed cache.

kvpress 0.5.5's `KVPressTextGenerationPipeline` is the reference: the chat-templated context compressed once, the
question + the template's suffix + the answer prefix appended uncompressed at positions after the *original* context
length, greedy decoding up to `max_new_tokens` stopping at EOS. kvpress prefills once per press and ratio; here each
example's context is prefilled once, exactly and in bounded memory (`spectra.kv.prefill`), and every press compresses
that one prefill at every ratio (`probes.tasks.TaskProbe`). The cells of `--batch-size` examples decode together
(`spectra.kv.batching`: one forward pass per greedy step for all their answers, in groups that fit `--decode-memory`,
each example still prefilled alone); the batch size is no part of the run's identity (the answers do not depend on
it), so a run may be resumed with another. The full cache is press
'full' at ratio 0 in every run. `query_aware` compresses the context with the question appended (kvpress's evaluation
convention: context + question compressed, question empty). `spectra cache` on a task file runs this study.

A record asking several questions (`questions`, kvpress's `questions=[…]`) is compressed once without them and every
question answered from the same compressed caches; under `query_aware` it is split into one compression per question
(`selection.units`), each question in view, so the loop's examples are its questions. A press that compresses while
decoding is refused on such a record before the model loads (its cache after one answer is not the context's; kvpress's
pipeline refuses DecodingPress with several questions).

Checked before the model loads, each in one line: every record (`tasks.records.read_records` names the line and field
of a missing or malformed field, an unknown task, an empty context or an answer its context lacks), a record's length
beyond the model's positions (when its files tell them), no --data, or data that is not a task file (a missing file,
a directory, a file not UTF-8 or whose first line is not JSON each said as such: `records.unreadable`). After
loading, each example's prompt is checked against the positions (`TaskSource.start`). The records evaluated:
`tasks.selection`.

Tables: task_examples.csv, task_scores.csv, task_lengths.csv, task_needle.csv, task_evicted.csv (`probes.tasks`);
run.json also names what the records' needles hide in (`haystacks`: name, sha256 and tasks, `selection.haystacks`),
which the run's first notice says, and the sha256 of the artifact presses' files (`artifacts`, `kv.provenance`); the
run loads as `report.evaluate.TaskRun`, and `spectra publish` writes its published form (`report.published`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import checkpoints
from ..config import RunConfig
from ..errors import SpectraError, spell
from ..options import option
from ..registry import PRESSES
from ..reporter import Reporter, plural
from ..kv.tasks import selection
from ..kv.tasks.records import TASK_FILE, unreadable
from .base import Analysis, register
from .pressbase import BATCH_HELP, DECODE_GIB, DECODE_HELP, PressOptions, PressStudy, check_decode_memory, smallest_gib

@dataclass(frozen=True)
class EvaluateOptions(PressOptions):
    """The presses and ratios compared on a task file's records, and whether the question is compressed too."""

    query_aware: bool = option(False, "Compress the context with the question appended (kvpress's evaluation "
                               "convention; a record asking several questions is compressed once per question, each "
                               "in view); by default the question is appended after compression.")
    tasks: str | None = option(None, "Only the records of these tasks of the task file (comma-separated, as its "
                               "records' `task` field names them; default: every task), each keeping its line, so "
                               "the run pools with runs of the whole file; --samples then spreads over them.",
                               metavar="NAMES")
    stop_answered: bool = option(False, "End each answer as soon as its score is final: once it holds every "
                                 "reference (RULER's string match cannot lose one as text is appended), so a base "
                                 "model that goes on talking after its answer stops there. Scores are those of the "
                                 "whole answers; the stored answers are their prefixes.")
    decode_memory: float = option(DECODE_GIB, DECODE_HELP, metavar="GIB", identity=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_decode_memory(self.decode_memory)
        if self.tasks is not None and not all(name.strip() for name in self.tasks.split(",")):
            raise SpectraError(f"{spell('--tasks')} takes task names separated by commas, got {self.tasks!r}")

    @property
    def task_names(self) -> tuple[str, ...] | None:
        """The tasks --tasks names, in its order (None: every task of the file)."""
        return None if self.tasks is None else tuple(name.strip() for name in self.tasks.split(","))


class Evaluate(PressStudy):
    """Decode each task record's answer greedily from every press's compressed cache and score it."""

    name = "evaluate"
    run_type = "TaskRun"
    summary = ("Long-context tasks from `spectra tasks`: each example prefilled once, every press at every ratio, "
               "answers decoded as kvpress's pipeline does and scored as RULER does, beside the full cache.")
    options = EvaluateOptions
    run_fields = tuple(name for name in Analysis.run_fields if name not in ("length", "mode"))
    defaults = {"samples": None, "batch_size": 1, "data": None}  # data: a task file, which has no default
    run_help = {"samples": "Records of the task file (default: all), spread evenly over its tasks and lengths "
                           "(seeded by --seed).",
                "batch_size": BATCH_HELP,
                "data": "A task file, required (.jsonl: kvpress's records, such as `spectra tasks` writes)."}
    decodes = "the task study decodes answers with a decoder"
    unit = "examples"
    outputs = {"task_examples.csv": ("press", "ratio", "example"), "task_scores.csv": ("press", "ratio", "task")}

    def configured(self, config: RunConfig, options: EvaluateOptions) -> RunConfig:
        """The records evaluated (`selection.evaluated`) and the length of the longest (what the loop and its memory
        check read before the prompts are built); data that is no task file is refused first. The batch size is the
        examples whose cells decode together (`TaskSource.batches`)."""
        if config.data is None:
            raise SpectraError(f"spectra evaluate reads {TASK_FILE}: give it as {spell('--data FILE', 'data=FILE')}")
        if not selection.wants_tasks(config.data):
            unreadable(config.data)  # missing, a directory, not UTF-8, its first line not JSON: said as such
            raise SpectraError(f"{config.data} is not a task file (kvpress's records with context, question and "
                               "answers, as `spectra tasks` writes them): give one, or run `spectra cache` for the "
                               "NLL of text")
        records = selection.evaluated(config, options.task_names)
        longest = max((record.length for record in records if record.length is not None), default=config.length)
        return replace(config, length=max(2, longest), samples=len(records))

    def job(self, config: RunConfig, options: EvaluateOptions, reporter: Reporter, found):
        """The base's job over what is prefilled: the records evaluated, or under --query-aware each question of a
        many-question record on its own (`selection.units`)."""
        job = super().job(config, options, reporter, found)
        return replace(job, samples=len(selection.units(selection.evaluated(config, options.task_names),
                                                        options.query_aware)))

    def check(self, config: RunConfig, options: EvaluateOptions, shape: checkpoints.Shape) -> None:
        """Every record of the file is read and checked (`records.read_records`), evaluated or not; a record longer
        than the model's positions is refused."""
        records = selection.records_of(config.data)
        super().check(config, options, shape)
        name = Path(config.data).name
        many = next((record for record in records if record.many), None)
        decoding = options.decoding_presses
        if many is not None and decoding:
            raise SpectraError(f"{name} line {many.example + 1} asks {len(many.asked)} questions, and "
                               f"{decoding[0]} compresses while it decodes: its cache after one answer is not the "
                               "context's, so the next question would read another cache (kvpress's pipeline refuses "
                               f"DecodingPress with several questions); drop {decoding[0]} from "
                               f"{spell('--presses')} or give single-question records")
        for record in records:
            if shape.positions is not None and record.length is not None and record.length > shape.positions:
                raise SpectraError(f"{name} line {record.example + 1}: its length {record.length} is beyond the "
                                   f"{shape.positions} positions of {shape.name}")

    def announce(self, config: RunConfig, options: EvaluateOptions, reporter: Reporter, given: RunConfig) -> None:
        """Say when --samples leaves records of the file out, and which tasks it leaves out whole; or when it asks for
        more records than the file holds (all of them run, as analyze uses all the sequences a corpus yields)."""
        name, tasks = Path(config.data).name, options.task_names
        total = len(selection.of_tasks(selection.records_of(config.data), tasks, name))
        held = name if tasks is None else f"{', '.join(tasks)} in {name} (--tasks)"
        if given.samples is not None and given.samples > total:
            reporter.notify(f"{held} holds {plural(total, 'record')} of the {given.samples} asked for (--samples); all "
                            "of them are evaluated")
        if config.samples < total:
            missing = selection.left_out(config, tasks)
            reporter.notify(f"evaluating {config.samples} of the {total} records of {held} (--samples), spread over "
                            "its tasks and lengths" + (f"; tasks left out: {', '.join(missing)}" if missing else ""))
        elif tasks is not None:
            reporter.notify(f"evaluating the {plural(total, 'record')} of {held}, each keeping its line")

    def source(self, config: RunConfig, options: EvaluateOptions, where: Any):
        """A `TaskSource` over the evaluated records."""
        from ..kv import passes
        from ..kv.tasks.examples import TaskSource

        records = selection.units(selection.evaluated(config, options.task_names), options.query_aware)
        missing = selection.left_out(config, options.task_names)
        return TaskSource(config, where, records, query_aware=options.query_aware, reads=passes.read_by(options.presses),
                          windowed=bool(PRESSES.having("windowed") & set(options.presses)), left_out=missing,
                          questioned=[press for press in options.presses
                                      if options.query_aware and press in PRESSES.having("reads_question")])

    def meta(self, config: RunConfig, options: EvaluateOptions, source) -> dict[str, Any]:
        """Also what the records' needles hide in: each haystack's name, sha256 and tasks (`selection.haystacks`)."""
        return {**super().meta(config, options, source), "haystacks": selection.haystacks(source.records)}

    def memory(self, config: RunConfig, options: EvaluateOptions, source) -> float:
        """Bytes an example takes: its prefill's and its full cache's (`TaskSource.prefill_bytes`); a batch holds
        --batch-size of them while their cells decode."""
        return source.prefill_bytes()

    def probe(self, config: RunConfig, options: EvaluateOptions, reporter: Reporter, source):
        """A `TaskProbe` over every press and ratio, once every check has passed: the run's first notice says what
        the records' needles hide in (`selection.haystack_notice`)."""
        from ..probes.tasks import TaskProbe

        said = selection.haystack_notice(selection.haystacks(source.records))
        if said is not None:
            reporter.notify(said)

        return TaskProbe(source, options.presses, options.ratios, config.seed, options.compression_interval,
                         int(options.decode_memory * 2**30), reporter, options.local_layers, options.stop_answered)

    def check_loaded(self, config: RunConfig, options: EvaluateOptions, source) -> None:
        """Also: --decode-memory must hold the largest cell of the longest example (its full cache), before any
        example runs."""
        super().check_loaded(config, options, source)
        needed = source.smallest_decode_bytes()
        if options.decode_memory * 2**30 < needed:
            least = smallest_gib(needed)
            raise SpectraError(f"{spell('--decode-memory', 'decode_memory')} {options.decode_memory:g} GiB cannot hold "
                               f"the full cache of the longest example ({needed / 2**30:.3g} GiB with its question "
                               f"and answer); give at least {spell(f'--decode-memory {least}', f'decode_memory={least}')}")


register(Evaluate())
