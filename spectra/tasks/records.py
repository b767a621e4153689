"""Task records: one long-context example (context, question, answer prefix, answers) as kvpress evaluates it.

Two file formats are read, both jsonl with one example per line:

- kvpress's evaluation format (what `spectra tasks` writes): `context`, `question`, `answer_prefix`, `answers`,
  `max_new_tokens`, `task`, and optionally `length` and `depth` (kvpress's own Hugging Face datasets name the
  answers `answer`, which is read too);
- RULER's prepared jsonl (scripts/data/prepare.py): `input` and `outputs`, optionally `answer_prefix` (RULER ≥ 2025
  writes the answer prefix apart; older files leave it at the end of `input`), `length`, `index`. The prompt is
  split into context, question and answer prefix exactly as kvpress's evaluation/benchmarks/ruler does: the context
  ends where the last question pattern of the task's family begins, the answer prefix starts at the family's answer
  pattern. RULER keeps one task per folder (`TASK/validation.jsonl`), so the task is the folder's name unless the
  record names it (`task`).

Torch-free, so the task protocol and the generator can import it cheaply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpectraError
from .family import families, family_of

#: the fields of kvpress's evaluation format; `answers` may be spelled `answer` (kvpress's datasets)
KVPRESS_FIELDS = ("context", "question", "answer_prefix", "answers", "max_new_tokens", "task")
#: the fields every RULER record carries
RULER_FIELDS = ("input", "outputs")

@dataclass(frozen=True)
class TaskRecord:
    """One example: the `context` the press compresses, the `question` and `answer_prefix` appended after it
    uncompressed, the reference `answers` scored against the prediction, the greedy decoding budget, the `task`
    name, the target `length` in tokens (template and generated tokens included, as RULER counts it), the needle's
    `depth` as a fraction of the context (0 = start, 1 = end; None for tasks without one needle), and `example`,
    the record's 0-based line index in its file."""

    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    max_new_tokens: int
    task: str
    length: int | None
    depth: float | None
    example: int

    def to_json(self) -> dict[str, object]:
        """The record as a line of kvpress's format (plus `length` and `depth`); `example` is the line's index."""
        return {"context": self.context, "question": self.question, "answer_prefix": self.answer_prefix,
                "answers": list(self.answers), "max_new_tokens": self.max_new_tokens, "task": self.task,
                "length": self.length, "depth": self.depth}


def split_ruler_prompt(text: str, task: str) -> tuple[str, str, str]:
    """(context, question, answer_prefix) of a RULER prompt of `task`, split as its family declares
    (`family.Family.split`: as kvpress's create_huggingface_dataset does)."""
    found = family_of(task)
    if found is None or found.question is None:
        raise SpectraError(f"cannot split a RULER prompt of task '{task}': its family '{task.split('_')[0]}' is not "
                           f"one of {', '.join(ruler_families())}")
    return found.split(text)


def ruler_families() -> list[str]:
    """The families RULER writes (whose prompts split into context, question and answer prefix)."""
    return sorted(name for name in families() if family_of(name).question is not None)  # type: ignore[union-attr]


def _answers(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise SpectraError(f"{where}: the answers must be a string or a non-empty list of strings, got {value!r}")
    return tuple(value)


def _optional(record: dict, name: str, kind: type, where: str) -> object:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise SpectraError(f"{where}: '{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _kvpress_record(record: dict, example: int, where: str) -> TaskRecord:
    if "answers" not in record and "answer" in record:
        record = {**record, "answers": record["answer"]}
    for name in KVPRESS_FIELDS:
        if name not in record:
            raise SpectraError(f"{where} has no field '{name}' (a task record needs {', '.join(KVPRESS_FIELDS)})")
    for name in ("context", "question", "answer_prefix", "task"):
        if not isinstance(record[name], str):
            raise SpectraError(f"{where}: '{name}' must be a string, got {type(record[name]).__name__}")
    if not record["task"]:
        raise SpectraError(f"{where}: 'task' is empty")
    max_new_tokens = _optional(record, "max_new_tokens", int, where)
    if max_new_tokens is None or max_new_tokens < 1:
        raise SpectraError(f"{where}: 'max_new_tokens' must be an integer ≥ 1, got {record['max_new_tokens']!r}")
    depth = _optional(record, "depth", float, where)
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise SpectraError(f"{where}: 'depth' is the needle's place in the context, in [0, 1]; got {depth}")
    return TaskRecord(record["context"], record["question"], record["answer_prefix"],
                      _answers(record["answers"], where), max_new_tokens, record["task"],
                      _optional(record, "length", int, where), depth, example)


def _ruler_record(record: dict, example: int, where: str, folder_task: str) -> TaskRecord:
    for name in RULER_FIELDS:
        if name not in record:
            raise SpectraError(f"{where} has no field '{name}' (a RULER record needs {', '.join(RULER_FIELDS)})")
    task = record.get("task", folder_task)
    found = family_of(task) if isinstance(task, str) else None
    if found is None or found.question is None:
        raise SpectraError(f"{where}: a RULER record's task is its folder's name (TASK/validation.jsonl) or its "
                           f"'task' field; '{task}' is not a RULER task ({', '.join(ruler_families())}…)")
    prefix = record.get("answer_prefix", "")
    if not isinstance(record["input"], str) or not isinstance(prefix, str):
        raise SpectraError(f"{where}: 'input' and 'answer_prefix' must be strings")
    try:
        context, question, answer_prefix = split_ruler_prompt(record["input"] + prefix, task)
    except SpectraError as error:
        raise SpectraError(f"{where}: {error}") from None
    return TaskRecord(context, question, answer_prefix, _answers(record["outputs"], where),
                      found.max_new_tokens, task, _optional(record, "length", int, where), None, example)


def _lines(path: Path) -> list[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SpectraError(f"cannot read the task file {path}: {error}") from None
    return [(number, line) for number, line in enumerate(text.splitlines()) if line.strip()]


def _parse(line: str, where: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SpectraError(f"{where} is not JSON: {error.msg} (column {error.colno})") from None
    if not isinstance(record, dict):
        raise SpectraError(f"{where} is not a JSON object")
    return record


def is_kvpress(record: dict) -> bool:
    """Whether a record carries kvpress's fields (context, question and answers — or answer)."""
    return "context" in record and "question" in record and ("answers" in record or "answer" in record)


def is_ruler(record: dict) -> bool:
    """Whether a record carries RULER's fields (input and outputs)."""
    return all(name in record for name in RULER_FIELDS)


def read_records(path: str | Path) -> list[TaskRecord]:
    """Every record of a task file, in its order. `example` is the record's 0-based line index (blank lines count,
    so it is the line a user finds in an editor, minus one). Bad input raises `SpectraError` naming the line
    (1-based) and the field."""
    path = Path(path)
    lines = _lines(path)
    if not lines:
        raise SpectraError(f"the task file {path} holds no record")
    first = _parse(lines[0][1], f"{path} line {lines[0][0] + 1}")
    ruler = not is_kvpress(first) and is_ruler(first)
    records = []
    for number, line in lines:
        where = f"{path} line {number + 1}"
        record = _parse(line, where)
        records.append(_ruler_record(record, number, where, path.parent.name) if ruler
                       else _kvpress_record(record, number, where))
    return records


def is_task_file(path: str | Path) -> bool:
    """Whether `path` is a .jsonl whose first record carries kvpress's fields or RULER's: the test `spectra cache`
    uses to choose the task protocol over the NLL one. Never raises on a file it cannot read (False)."""
    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    record = json.loads(line)
                    return isinstance(record, dict) and (is_kvpress(record) or is_ruler(record))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False
