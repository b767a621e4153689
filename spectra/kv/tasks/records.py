"""Task records: one long-context example (context, question, answer prefix, answers) as kvpress evaluates it.

Two file formats are read, both jsonl with one example per line:

- kvpress's evaluation format (what `spectra tasks` writes): `context`, `question`, `answer_prefix`, `answers`,
  `max_new_tokens`, `task`, and optionally spectra's `length`, `depth`, `haystack` and `haystack_sha256` (what the
  needles hide in: the haystack's name and the sha256 of its text; null for a task with no haystack, and absent —
  unknown — in files written before spectra recorded it: their essay tasks read RULER's noise unless `--haystack`
  named a file) (kvpress's own Hugging Face datasets name the answers `answer`, which is read too). A record may
  ask several questions of its context instead of one, as kvpress's pipeline takes `questions=[…]`: `questions` (a
  list of questions) in place of `question`, and `answers` a list holding each question's accepted answers (a
  string or a list of strings, as a single question's). A list of one question is the record `question` makes, as
  in kvpress's pipeline (it turns `question=q` into `questions=[q]`): it is written back as `question`;
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
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import SpectraError, spell
from ...inputs import utf8
from .family import families, family_of
from .question import Asking, Question, numbered

#: the fields of kvpress's evaluation format; `answers` may be spelled `answer` (kvpress's datasets)
KVPRESS_FIELDS = ("context", "question", "answer_prefix", "answers", "max_new_tokens", "task")
#: the fields every RULER record carries
RULER_FIELDS = ("input", "outputs")
#: every field that marks a task record (kvpress's, its datasets' `answer`, a many-question record's
#: `questions`, RULER's)
TASK_FIELDS = frozenset((*KVPRESS_FIELDS, "answer", "questions", *RULER_FIELDS))


@dataclass(frozen=True)
class TaskRecord(Asking):
    """One example: the `context` the press compresses, the questions it `asked` (`question.Question`: one, or
    several — kvpress's `questions=[…]`: the context compressed once, without any question, then each question
    answered from that one compressed cache) and the `answer_prefix` appended after each question uncompressed, the
    greedy decoding budget, the `task` name, the target `length` in tokens (template and generated tokens included,
    as RULER counts it), the needle's `depth` as a fraction of the context (0 = start, 1 = end; None for tasks
    without one needle), and `example`, the record's 0-based line index in its file. `answers` are the record's
    (its question's, or every question's: `question.Asking`). A record split into one record per question (`split`)
    keeps each question's index within its line.

    `haystack` names what the needles hide in (`haystack.Haystack.name`: "noise", "needle", the files of an essay
    stand-in) and `haystack_sha256` the sha256 of its text; None where the record does not say (a file written
    before spectra recorded it, RULER's or kvpress's own) or the task has no haystack."""

    context: str
    asked: tuple[Question, ...]
    answer_prefix: str
    max_new_tokens: int
    task: str
    length: int | None
    depth: float | None
    example: int
    haystack: str | None = None
    haystack_sha256: str | None = None

    def split(self) -> list[TaskRecord]:
        """One single-question record per question (each keeping its index): the record as the query-aware protocol
        compresses it, one question in view per compression."""
        return [replace(self, asked=(asked,)) for asked in self.asked]

    def to_json(self) -> dict[str, object]:
        """The record as a line of kvpress's format (plus `length`, `depth`, `haystack` and `haystack_sha256`):
        `question` and its `answers` for one question, `questions` and a list of answers per question for several;
        `example` is the line's index."""
        asked = ({"questions": [asked.text for asked in self.asked], "answer_prefix": self.answer_prefix,
                  "answers": [list(asked.answers) for asked in self.asked]} if self.many else
                 {"question": self.asked[0].text, "answer_prefix": self.answer_prefix,
                  "answers": list(self.asked[0].answers)})
        return {"context": self.context, **asked, "max_new_tokens": self.max_new_tokens, "task": self.task,
                "length": self.length, "depth": self.depth, "haystack": self.haystack,
                "haystack_sha256": self.haystack_sha256}


def split_ruler_prompt(text: str, task: str) -> tuple[str, str, str]:
    """(context, question, answer_prefix) of a RULER prompt of `task`, split as its family declares
    (`family.Family.split`: as kvpress's create_huggingface_dataset does)."""
    found = family_of(task)
    if found is None or found.question_pattern is None:
        raise SpectraError(f"cannot split a RULER prompt of task '{task}': its family '{task.split('_')[0]}' is not "
                           f"one of {', '.join(ruler_families())}")
    return found.split(text)


def ruler_families() -> list[str]:
    """The families RULER writes (whose prompts split into context, question and answer prefix)."""
    return sorted(name for name in families() if family_of(name).question_pattern is not None)  # type: ignore[union-attr]


def _answers(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise SpectraError(f"{where}: the answers must be a string or a non-empty list of strings, got {value!r}")
    return tuple(value)


def _questions(record: dict, where: str) -> tuple[Question, ...]:
    """A `questions` record's questions, each with its answers, refused in one line where they do not pair up."""
    if "question" in record:
        raise SpectraError(f"{where} has both 'question' and 'questions'; a record asks one question ('question', "
                           "'answers' its accepted answers) or several ('questions', 'answers' a list per question), "
                           "as kvpress's pipeline takes question= or questions=: drop one")
    questions, answers = record["questions"], record["answers"]
    if not isinstance(questions, list) or not questions:
        raise SpectraError(f"{where}: 'questions' must be a non-empty list of questions, got {questions!r}")
    for i, question in enumerate(questions):
        if not isinstance(question, str) or not question.strip():
            raise SpectraError(f"{where}: question {i} of 'questions' must be a non-empty string, got {question!r}")
    if not isinstance(answers, list) or len(answers) != len(questions):
        count = len(answers) if isinstance(answers, list) else "no list"
        raise SpectraError(f"{where}: 'answers' must hold one entry per question (the accepted answers of each: a "
                           f"string or a list of strings); it has {count} for {len(questions)} questions")
    return numbered(questions, [_answers(accepted, f"{where}: question {i}") for i, accepted in enumerate(answers)])


def _optional(record: dict, name: str, kind: type, where: str) -> object:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise SpectraError(f"{where}: '{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _haystack(record: dict, where: str) -> dict[str, str | None]:
    """The record's `haystack` and `haystack_sha256` (None when absent or null), refused unless strings."""
    found = {name: record.get(name) for name in ("haystack", "haystack_sha256")}
    for name, value in found.items():
        if value is not None and (not isinstance(value, str) or not value):
            raise SpectraError(f"{where}: '{name}' must be a non-empty string or null, got {value!r}")
    return found


def _kvpress_record(record: dict, example: int, where: str) -> TaskRecord:
    if "answers" not in record and "answer" in record:
        record = {**record, "answers": record["answer"]}
    many = "questions" in record
    for name in KVPRESS_FIELDS:
        if name not in record and not (many and name == "question"):
            raise SpectraError(f"{where} has no field '{name}' (a task record needs {', '.join(KVPRESS_FIELDS)})")
    for name in ("context", "answer_prefix", "task") if many else ("context", "question", "answer_prefix", "task"):
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
    if family_of(record["task"]) is None:
        raise SpectraError(f"{where}: unknown task '{record['task']}' (task families: {', '.join(families())}; a "
                           "task is named after its family, e.g. niah_single_1)")
    length = _optional(record, "length", int, where)
    haystack = _haystack(record, where)
    asked = (_questions(record, where) if many else
             numbered([record["question"]], [_answers(record["answers"], where)]))
    return checked(TaskRecord(record["context"], asked, record["answer_prefix"], max_new_tokens, record["task"],
                              length, depth, example, **haystack), where)


def _ruler_record(record: dict, example: int, where: str, folder_task: str) -> TaskRecord:
    for name in RULER_FIELDS:
        if name not in record:
            raise SpectraError(f"{where} has no field '{name}' (a RULER record needs {', '.join(RULER_FIELDS)})")
    task = record.get("task", folder_task)
    found = family_of(task) if isinstance(task, str) else None
    if found is None or found.question_pattern is None:
        raise SpectraError(f"{where}: a RULER record's task is its folder's name (TASK/validation.jsonl) or its "
                           f"'task' field; '{task}' is not a RULER task ({', '.join(ruler_families())}…)")
    prefix = record.get("answer_prefix", "")
    if not isinstance(record["input"], str) or not isinstance(prefix, str):
        raise SpectraError(f"{where}: 'input' and 'answer_prefix' must be strings")
    try:
        context, question, answer_prefix = split_ruler_prompt(record["input"] + prefix, task)
    except SpectraError as error:
        raise SpectraError(f"{where}: {error}") from None
    return checked(TaskRecord(context, numbered([question], [_answers(record["outputs"], where)]), answer_prefix,
                              found.max_new_tokens, task, _optional(record, "length", int, where), None, example),
                   where)


def checked(record: TaskRecord, where: str) -> TaskRecord:
    """`record`, refused when it could not be answered from its context: an empty context, or (for a family whose
    answers are strings of the context: `Family.extractive`) an answer that does not occur in it as written —
    generation refuses such examples too, and a run would score them 0 with no needle to follow."""
    if not record.context.strip():
        raise SpectraError(f"{where}: 'context' is empty; a task record needs the text the press compresses")
    family = family_of(record.task)
    if family is not None and family.extractive:
        for answer in record.answers:
            if answer not in record.context:
                raise SpectraError(f"{where}: the answer '{answer}' does not occur in its 'context' (a {family.name} "
                                   "task's answers are strings of the context, case included): correct 'answers' or "
                                   "'context'")
    return record


#: what a task file is, as the messages that refuse one say it
TASK_FILE = "a task file (.jsonl, one record of kvpress's fields a line, as `spectra tasks` writes them)"


def _text(path: Path) -> str:
    """The file's text, or one line saying why it cannot be read: missing, a directory, unreadable, not UTF-8."""
    if not path.exists():
        raise SpectraError(f"{spell('--data', 'data')} {path}: no such file; give {TASK_FILE}")
    if path.is_dir():
        raise SpectraError(f"{spell('--data', 'data')} {path} is a directory; give {TASK_FILE}")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise SpectraError(f"cannot read the task file {path}: {error.strerror}") from None
    return utf8(raw, str(path), "a task file is UTF-8 jsonl: convert it (e.g. iconv -t UTF-8) or give another")


def _lines(path: Path) -> list[tuple[int, str]]:
    return [(number, line) for number, line in enumerate(_text(path).splitlines()) if line.strip()]


def unreadable(path: str | Path) -> None:
    """Refuse (one line, saying why) a file that `is_task_file` turned down before its records could be looked at:
    missing, a directory, not UTF-8, or a .jsonl whose first record is not JSON. A readable file of other records
    (text, not tasks) passes: the caller says what it is."""
    path = Path(path)
    lines = _lines(path)
    if path.suffix == ".jsonl" and lines and not lines[0][1].lstrip().startswith("["):  # an array: is_task_file's
        _parse(lines[0][1], f"{path} line {lines[0][0] + 1}")


def _parse(line: str, where: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SpectraError(f"{where} is not JSON: {error.msg} (column {error.colno}); a task file holds one JSON "
                           "record a line") from None
    if not isinstance(record, dict):
        raise SpectraError(f"{where} is not a JSON object")
    return record


def is_kvpress(record: dict) -> bool:
    """Whether a record carries kvpress's fields (context, question — or questions — and answers — or answer)."""
    return "context" in record and ("question" in record or "questions" in record) and (
        "answers" in record or "answer" in record)


def is_ruler(record: dict) -> bool:
    """Whether a record carries RULER's fields (input and outputs)."""
    return all(name in record for name in RULER_FIELDS)


def looks_like_task(record: object) -> bool:
    """Whether a JSON value looks like a task record: an object with kvpress's or RULER's fields, or two of them at
    least (a record missing one is a task record to refuse by its field, not a text corpus)."""
    if not isinstance(record, dict):
        return False
    return is_kvpress(record) or is_ruler(record) or len(TASK_FIELDS & record.keys()) >= 2


def _array(text: str, path: Path) -> None:
    """Refuse a file holding one JSON array of records (jsonl is one object a line)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(value, list):
        raise SpectraError(f"{path} holds a JSON array of {len(value)} records; a task file holds one record (a "
                           "JSON object) per line: write each record on a line of its own")


def read_records(path: str | Path) -> list[TaskRecord]:
    """Every record of a task file, in its order. `example` is the record's 0-based line index (blank lines count,
    so it is the line a user finds in an editor, minus one). Bad input raises `SpectraError` naming the line
    (1-based) and the field."""
    path = Path(path)
    lines = _lines(path)
    if not lines:
        raise SpectraError(f"the task file {path} holds no record")
    if lines[0][1].lstrip().startswith("["):
        _array(path.read_text(encoding="utf-8"), path)
    first = _parse(lines[0][1], f"{path} line {lines[0][0] + 1}")
    ruler = not is_kvpress(first) and ("input" in first or "outputs" in first)
    records = []
    for number, line in lines:
        where = f"{path} line {number + 1}"
        record = _parse(line, where)
        records.append(_ruler_record(record, number, where, path.parent.name) if ruler
                       else _kvpress_record(record, number, where))
    return records


def is_task_file(path: str | Path) -> bool:
    """Whether `path` is a .jsonl whose first record looks like a task record (`looks_like_task`), or that holds a
    JSON array whose first item does: the test `spectra cache` uses to choose the task protocol over the NLL one, so
    a task file with a missing field is refused by `read_records` naming it. Never raises on a file it cannot read
    (False)."""
    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    break
            else:
                return False
            if line.lstrip().startswith("["):  # a JSON array, on one line or several
                try:
                    value = json.loads(line)
                except json.JSONDecodeError:
                    value = json.loads(line + handle.read())
                return isinstance(value, list) and bool(value) and looks_like_task(value[0])
            return looks_like_task(json.loads(line))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
