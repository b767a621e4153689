"""`spectra tasks MODEL …`: check the request, read the model's tokenizer and positions (never its weights),
generate the task file and say what was written.

Every bad input is one line before anything heavy happens: task names, lengths, samples, the haystack (its files
read and checked: missing, empty, binary, not UTF-8; the default's absence) and the output path first; then the
model's files (a directory, a GGUF file or a hub id), its decoder-ness and its positions, read from its config or
GGUF header, so a length beyond them stops before the tokenizer loads. A haystack text the contexts would repeat
more than `generate.MOST_REPEATS` times is refused once the examples are fitted, before the file is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ... import checkpoints
from ...errors import SpectraError, spell
from ...registry import TASKS
from .generate import (Fitted, check_repeats, choose_haystack, generate, haystack_note, parse_lengths, parse_tasks,
                       write_records)
from .haystack import Haystack


@dataclass(frozen=True)
class TaskRequest:
    """What `spectra tasks` is asked for (`spectra.tasks`'s keywords), as given: `samples` records per task of `tasks`
    and length of `lengths` for `model`'s tokenizer (its `gguf_file` inside a directory), the essay tasks reading
    `haystack`, written to `out` (replaced only with `overwrite`); `make_tasks` checks each in one line."""

    model: str
    tasks: str | Sequence[str]
    lengths: str | Sequence[int]
    samples: int
    out: str | Path
    haystack: str | Path | Sequence[str | Path] | None
    seed: int
    gguf_file: str | None
    overwrite: bool


@dataclass(frozen=True)
class Written:
    """What `make_tasks` wrote: the file, its records (with sizes and token counts), the model's positions, the
    essay tasks' `haystack` and what the user should know of them (`notes`: a haystack text repeated to fill the
    contexts)."""

    path: Path
    fitted: list[Fitted]
    positions: int | None
    haystack: Haystack
    notes: tuple[str, ...] = ()


def haystack_line(written: Written) -> str | None:
    """What the command says of the essay tasks' haystack: "niah_single_2 hid their needles in
    /usr/share/common-licenses (37381 words, sha256 e702fc128a22…)"; None when no task written reads one."""
    reading = list(dict.fromkeys(item.record.task for item in written.fitted
                                 if TASKS.facts(item.record.task)["haystack"]))
    if not reading:
        return None
    stack = written.haystack
    what = ("RULER's noise sentence repeated (--haystack noise)" if stack.words is None else
            f"{stack.name} ({len(stack.words)} words, sha256 {stack.sha256[:12]}…)")
    return f"{', '.join(reading)} hid their needles in {what}"


def check_positions(lengths: Sequence[int], positions: int | None, name: str) -> None:
    """A length beyond the model's positions cannot be run: refuse it."""
    if positions is not None and max(lengths) > positions:
        raise SpectraError(f"{spell('--length', 'lengths')} {max(lengths)} is beyond the {positions} positions of "
                           f"{name}")


def check_out(out: Path, overwrite: bool) -> Path:
    """The task file to write, refused in one line before any work unless it can be written: a .jsonl path that is
    no directory, replaced only with `overwrite` (as a run directory), in a place that accepts a new file (not below
    a file, not in /proc or a read-only file system: `rundir.check_writable`). Missing folders are made when the
    file is written, as for a run directory."""
    from ...rundir import check_writable

    if out.is_dir():
        raise SpectraError(f"{spell('--out', 'out')} {out} is a directory; give a .jsonl file path")
    if out.suffix != ".jsonl":
        raise SpectraError(f"{spell('--out', 'out')} {out} must end in .jsonl (spectra cache recognises task files "
                           "by it)")
    if out.exists() and not overwrite:
        raise SpectraError(f"{spell('--out', 'out')} {out} already exists; pass {spell('--overwrite', 'overwrite=True')} "
                           f"to replace it or choose another {spell('--out', 'out')}")
    check_writable(out, "--out")
    return out


def load_tokenizer(request: TaskRequest, lengths: Sequence[int]):
    """(tokenizer, positions) of the request's model, after checking `lengths` against its positions where its files
    tell them before the tokenizer loads (a local config.json or GGUF header), else right after from its config."""
    model = request.model  # a config and a tokenizer are enough:
    source = checkpoints.inspect(model, request.gguf_file, weights=False)
    shape = source.shape()
    if shape.causal is False:
        raise SpectraError(f"{source.label} is not a decoder: the task protocol decodes answers (spectra tasks "
                           "needs a causal language model)")
    check_positions(lengths, shape.positions, source.label)
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from ... import hub

    if not source.local:
        hub.prepare()
    transformers.logging.set_verbosity_error()
    where = str(source.path) if source.gguf_file else source.where
    options = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **options)
        positions = shape.positions
        if positions is None:
            config = AutoConfig.from_pretrained(where, **options).to_dict()
            limit = getattr(tokenizer, "model_max_length", None)
            positions = checkpoints.config_shape(config, source.label, limit if isinstance(limit, int) else None
                                                 ).positions
    except OSError:
        raise SpectraError(f"cannot read the tokenizer of '{model}' (not a local model, and not in the hub's "
                           "cache)") from None
    except ValueError as error:
        raise SpectraError(f"cannot read the tokenizer of '{model}': {str(error).splitlines()[0]}") from None
    check_positions(lengths, positions, source.label)
    return tokenizer, positions


def make_tasks(request: TaskRequest, progress: Callable[[str, int, list[Fitted]], None] | None = None) -> Written:
    """Generate the request's records for its model's tokenizer and write them to its `out` (jsonl); an existing
    `out` is replaced only with `overwrite`, as a run directory is. The essay tasks read `haystack`: text files or
    folders (comma-separated in a string), "noise", or by default the licence texts Debian ships
    (`generate.choose_haystack`)."""
    names, sizes = parse_tasks(request.tasks), parse_lengths(request.lengths)
    if request.samples < 1:
        raise SpectraError(f"{spell('--samples', 'samples')} must be ≥ 1, got {request.samples}")
    if request.seed < 0:
        raise SpectraError(f"{spell('--seed', 'seed')} must be ≥ 0, got {request.seed}")
    stack = choose_haystack(request.haystack, names)
    out = check_out(Path(request.out), request.overwrite)
    tokenizer, positions = load_tokenizer(request, sizes)
    fitted = generate(tokenizer, names, sizes, request.samples, request.seed, stack, progress)
    check_repeats(fitted, stack)
    note = haystack_note(fitted, stack)
    return Written(write_records(out, [item.record for item in fitted]), fitted, positions, stack,
                   () if note is None else (note,))
