"""Task files: kvpress's format and RULER's prepared jsonl read into TaskRecords; bad input named by line and field."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from spectra.errors import SpectraError
from spectra.kv.tasks.question import Question, numbered
from spectra.kv.tasks.records import TaskRecord, is_task_file, read_records, split_ruler_prompt, unreadable

#: a RULER niah prompt as prepare.py builds it with the base template (one needle: "Some" → "A", "are" → "is")
NIAH = ("A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
        "about the number afterwards.\nThe grass is green.\nOne of the special magic numbers for tame-lake is: "
        "4711.\nThe sky is blue.\nWhat is the special magic number for tame-lake mentioned in the provided text?")
NIAH_PREFIX = " The special magic number for tame-lake mentioned in the provided text is"
VT = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\nVAR AB = 1 noise\n"
      "Question: Find all variables that are assigned the value 1 in the text above.")
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, 1 variables are assigned "
             "the value 1, they are: ")


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def kvpress_line(**overrides) -> dict:
    line = {"context": "ctx x", "question": "q?", "answer_prefix": "A:", "answers": ["x"], "max_new_tokens": 8,
            "task": "passkey", "length": 1024, "depth": 0.5}
    line.update(overrides)
    return {k: v for k, v in line.items() if v is not None}


def test_kvpress_records_round_trip(tmp_path: Path) -> None:
    record = TaskRecord("c a b", numbered(["q"], [("a", "b")]), "p", 30, "vt", 2048, None, 0)
    path = write_jsonl(tmp_path / "t.jsonl", [record.to_json(), "", kvpress_line(length=None, depth=None)])
    first, second = read_records(path)
    assert first == record
    assert second == TaskRecord("ctx x", (Question(0, "q?", ("x",)),), "A:", 8, "passkey", None, None, 2)  # line 2
    assert is_task_file(path)


def test_the_haystack_a_record_read_is_a_field(tmp_path: Path) -> None:
    """Each record names what its needles hide in and the sha256 of that text (written and read back); a record of a
    file written before spectra recorded it, or of kvpress's or RULER's own files, reads as unknown (None), since
    its essay tasks may have read RULER's noise or a --haystack file; null is written where there is none."""
    digest = "e702fc128a22ec5f42b88d701ba068de1515b336f5af4e0d6e144a3795587db2"
    record = TaskRecord("c a b", numbered(["q"], [["a"]]), "p", 30, "niah_single_2", 2048, 0.5, 0,
                        haystack="/usr/share/common-licenses", haystack_sha256=digest)
    line = record.to_json()
    assert (line["haystack"], line["haystack_sha256"]) == ("/usr/share/common-licenses", digest)
    many = TaskRecord("c a b", numbered(["q?", "r?"], [["a"], ["b"]]), "p", 8, "niah_multiquery_questions", 512, 0.0,
                      1, haystack="noise", haystack_sha256=digest)
    path = write_jsonl(tmp_path / "t.jsonl", [line, many.to_json(), kvpress_line(context="x")])
    first, second, old = read_records(path)
    assert first == record and second == many and (second.haystack, second.haystack_sha256) == ("noise", digest)
    assert (old.haystack, old.haystack_sha256) == (None, None)
    assert "haystack" in TaskRecord("c", numbered(["q"], [["c"]]), "p", 8, "cwe", 64, None, 0).to_json()


def test_kvpress_datasets_spell_the_answers_answer(tmp_path: Path) -> None:
    line = kvpress_line()
    line["answer"] = line.pop("answers")
    assert read_records(write_jsonl(tmp_path / "t.jsonl", [line]))[0].answers == ("x",)


def test_a_ruler_prompt_is_split_as_kvpress_splits_it() -> None:
    context, question, prefix = split_ruler_prompt(NIAH + NIAH_PREFIX, "niah_single_1")
    assert context + question + prefix == NIAH + NIAH_PREFIX
    assert context.endswith("The sky is blue.\n")
    assert question == "What is the special magic number for tame-lake mentioned in the provided text? "
    assert prefix == "The special magic number for tame-lake mentioned in the provided text is"
    context, question, prefix = split_ruler_prompt(VT + VT_PREFIX, "vt")
    assert question == "Question: Find all variables that are assigned the value 1 in the text above. "
    assert prefix.startswith("Answer: According")


def test_ruler_files_old_and_new(tmp_path: Path) -> None:
    """RULER ≥ 2025 keeps the answer prefix apart, older files at the end of `input`: both read the same."""
    new = {"index": 7, "input": NIAH, "outputs": ["4711"], "length": 120, "answer_prefix": NIAH_PREFIX}
    old = {"index": 7, "input": NIAH + NIAH_PREFIX, "outputs": ["4711"], "length": 120}
    first, second = read_records(write_jsonl(tmp_path / "niah_single_1" / "validation.jsonl", [new, old]))
    assert first.task == "niah_single_1" and first.max_new_tokens == 128 and first.length == 120
    assert (first.context, first.asked, first.answer_prefix) == (second.context, second.asked, second.answer_prefix)
    assert (first.example, second.example, first.depth) == (0, 1, None)
    vt = read_records(write_jsonl(tmp_path / "x" / "v.jsonl", [{"input": VT + VT_PREFIX, "outputs": ["AB"],
                                                                 "task": "vt"}]))[0]
    assert vt.max_new_tokens == 30 and vt.answers == ("AB",)
    assert is_task_file(tmp_path / "niah_single_1" / "validation.jsonl")


@pytest.mark.parametrize("line, message", [
    (kvpress_line(question=None), "line 2 has no field 'question'"),
    (kvpress_line(max_new_tokens=0), "line 2: 'max_new_tokens' must be an integer ≥ 1"),
    (kvpress_line(answers=[]), "line 2: the answers must be"),
    (kvpress_line(depth=50), "line 2: 'depth'"),
    (kvpress_line(length="long"), "line 2: 'length' must be an integer"),
    ("{not json", "line 2 is not JSON"),
    ("[1, 2]", "line 2 is not a JSON object"),
    (kvpress_line(task="sudoku"), "line 2: unknown task 'sudoku' (task families: niah, vt, cwe, fwe, passkey, qa"),
    (kvpress_line(answers=["y", "x"]), "line 2: the answer 'y' does not occur in its 'context' (a passkey task's"),
    (kvpress_line(answers=["X"]), "line 2: the answer 'X' does not occur in its 'context'"),
    (kvpress_line(context=" \n"), "line 2: 'context' is empty; a task record needs the text the press compresses"),
    (kvpress_line(haystack=3), "line 2: 'haystack' must be a non-empty string or null, got 3"),
    (kvpress_line(haystack_sha256=""), "line 2: 'haystack_sha256' must be a non-empty string or null, got ''"),
])
def test_a_bad_record_names_its_line_and_field(tmp_path: Path, line, message: str) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [kvpress_line(), line])
    with pytest.raises(SpectraError, match=re.escape(message)):
        read_records(path)


def test_answers_of_a_family_that_is_not_extractive_need_not_occur(tmp_path: Path) -> None:
    """A qa answer is the dataset's (HotpotQA's "yes"), not a span: such a record is read; a vt record whose
    answer is missing from its RULER prompt is refused as a kvpress record would be."""
    qa = ("Answer the question based on the given documents.\nDocument 1: Paris is large.\nAnswer the question based "
          "on the given documents.\nQuestion: Is Paris large? Answer:")
    record = read_records(write_jsonl(tmp_path / "qa_2" / "v.jsonl", [{"input": qa, "outputs": ["yes"]}]))[0]
    assert record.answers == ("yes",) and record.max_new_tokens == 32
    with pytest.raises(SpectraError, match="line 1: the answer 'ZZ' does not occur in its 'context' \\(a vt task's"):
        read_records(write_jsonl(tmp_path / "vt" / "v.jsonl", [{"input": VT + VT_PREFIX, "outputs": ["ZZ"]}]))


def test_bad_ruler_records(tmp_path: Path) -> None:
    with pytest.raises(SpectraError, match="line 1: a RULER record's task is its folder's name"):
        read_records(write_jsonl(tmp_path / "mine" / "v.jsonl", [{"input": NIAH, "outputs": ["1"]}]))
    with pytest.raises(SpectraError, match="line 2 has no field 'outputs'"):
        read_records(write_jsonl(tmp_path / "vt" / "v.jsonl", [{"input": VT + VT_PREFIX, "outputs": ["1"]},
                                                              {"input": VT + VT_PREFIX}]))
    with pytest.raises(SpectraError, match="line 1: the RULER prompt has no question of a niah task"):
        read_records(write_jsonl(tmp_path / "niah_single_2" / "v.jsonl", [{"input": VT, "outputs": ["1"]}]))


def test_a_file_that_looks_like_task_records_is_read_as_one(tmp_path: Path) -> None:
    """A first record missing its answers or its question, or records written as one JSON array, are task records
    to refuse by what is wrong — not a text corpus without a 'text' column."""
    for missing in ("answers", "question"):
        path = write_jsonl(tmp_path / f"no-{missing}.jsonl", [kvpress_line(**{missing: None}), kvpress_line()])
        assert is_task_file(path)
        with pytest.raises(SpectraError, match=f"no-{missing}.jsonl line 1 has no field '{missing}'"):
            read_records(path)
    ruler = write_jsonl(tmp_path / "vt" / "r.jsonl", [{"input": VT, "answer_prefix": VT_PREFIX, "length": 9}])
    assert is_task_file(ruler)
    with pytest.raises(SpectraError, match="line 1 has no field 'outputs' \\(a RULER record needs input, outputs\\)"):
        read_records(ruler)
    for name, text in (("one-line", json.dumps([kvpress_line(), kvpress_line()])),
                       ("indented", json.dumps([kvpress_line(), kvpress_line()], indent=2))):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text + "\n")
        assert is_task_file(path)
        with pytest.raises(SpectraError, match=f"{name}.jsonl holds a JSON array of 2 records; a task file holds one "
                                               "record \\(a JSON object\\) per line"):
            read_records(path)
    for rows in ([{"text": "a"}], [{"context": "a corpus column"}], [[{"text": "a"}]], [[]]):
        assert not is_task_file(write_jsonl(tmp_path / "corpus.jsonl", [json.dumps(row) for row in rows]))


def test_empty_and_foreign_files(tmp_path: Path) -> None:
    empty = write_jsonl(tmp_path / "e.jsonl", ["", "  "])
    with pytest.raises(SpectraError, match="holds no record"):
        read_records(empty)
    assert not is_task_file(empty)
    assert not is_task_file(write_jsonl(tmp_path / "text.jsonl", [{"text": "hello"}]))
    assert not is_task_file(write_jsonl(tmp_path / "t.txt", [kvpress_line()]))
    assert not is_task_file(write_jsonl(tmp_path / "bad.jsonl", ["{oops"]))
    assert not is_task_file(tmp_path / "missing.jsonl")
    with pytest.raises(SpectraError, match="missing.jsonl: no such file; give a task file"):
        read_records(tmp_path / "missing.jsonl")


def test_a_file_turned_down_unread_is_refused_saying_why(tmp_path: Path) -> None:
    """Issue 55, item 2: what `is_task_file` turns down before looking at a record — no such file, a directory, bytes
    that are not UTF-8 (the line they are on), a first line that is not JSON — each refused by `unreadable` as what it
    is; a readable file of other records passes, for the caller to say it is text."""
    cases = {"missing.jsonl": None, "": None, "latin.jsonl": b"\n" + json.dumps(kvpress_line()).encode()[:40] + b"\xe9\n",
             "broken.jsonl": b"\n\n{oops\n" + json.dumps(kvpress_line()).encode() + b"\n"}
    for name, content in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
    for name, message in (("missing.jsonl", "data missing.jsonl: no such file; give a task file (.jsonl,"),
                          ("", f"data {tmp_path} is a directory; give a task file"),
                          ("latin.jsonl", "latin.jsonl is not UTF-8 text (byte 0xe9 on line 2); a task file is UTF-8"),
                          ("broken.jsonl", "broken.jsonl line 3 is not JSON: Expecting property name enclosed in "
                                           "double quotes (column 2); a task file holds one JSON record a line")):
        path = tmp_path / name
        assert not is_task_file(path)
        with pytest.raises(SpectraError) as refused:
            unreadable(path if name else tmp_path)
        assert message in str(refused.value).replace(str(tmp_path) + "/", ""), refused.value
        with pytest.raises(SpectraError) as read:  # reading the records says the same
            read_records(path if name else tmp_path)
        assert str(read.value) == str(refused.value)
    unreadable(write_jsonl(tmp_path / "text.jsonl", [{"text": "hello"}]))
    unreadable(write_jsonl(tmp_path / "t.txt", ["plain prose"]))


def test_the_package_imports_without_torch() -> None:
    import subprocess
    import sys

    code = "import sys, spectra.kv.tasks.records, spectra.kv.tasks.scoring; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(Path(__file__).parents[2])})
    assert done.stdout.strip() == "False"


def test_a_record_asking_several_questions(tmp_path: Path) -> None:
    """kvpress's `questions=[…]`: `questions` with `answers` a list per question (each a string or a list, as one
    question's), read into one record whose questions keep their index; written back as it was read; split into
    one single-question record per question for the query-aware protocol."""
    line = kvpress_line(question=None, questions=["q0?", "q1?"], answers=[["x"], "ctx"], context="ctx x")
    path = write_jsonl(tmp_path / "t.jsonl", [line, kvpress_line()])
    many, one = read_records(path)
    assert many.asked == (Question(0, "q0?", ("x",)), Question(1, "q1?", ("ctx",)))
    assert many.answers == ("x", "ctx") and many.many
    assert one.asked == (Question(0, "q?", ("x",)),) and one.answers == ("x",) and not one.many
    assert many.to_json() == {**line, "answers": [["x"], ["ctx"]], "haystack": None, "haystack_sha256": None}
    assert read_records(write_jsonl(tmp_path / "again.jsonl", [many.to_json()]))[0] == many
    parts = many.split()
    assert [(part.asked, part.answers, part.example) for part in parts] == [
        ((Question(0, "q0?", ("x",)),), ("x",), 0), ((Question(1, "q1?", ("ctx",)),), ("ctx",), 0)]
    assert not any(part.many for part in parts) and one.split() == [one]


def test_a_list_of_one_question_is_the_record_question_makes(tmp_path: Path) -> None:
    """kvpress's pipeline turns `question=q` into `questions=[q]`: a record of `questions` holding one question is
    the record `question` makes, written back as `question` with its answers."""
    line = kvpress_line(question=None, questions=["q?"], answers=[["x"]])
    listed, plain = read_records(write_jsonl(tmp_path / "t.jsonl", [line, kvpress_line()]))
    assert listed == replace(plain, example=0) and not listed.many
    assert listed.to_json() == {**kvpress_line(), "haystack": None, "haystack_sha256": None}


@pytest.mark.parametrize("line, message", [
    (kvpress_line(questions=["a?"], answers=[["x"]]), "line 1 has both 'question' and 'questions'"),
    (kvpress_line(question=None, questions=["a?", "b?"], answers=[["x"]]),
     "'answers' must hold one entry per question (the accepted answers of each: a string or a list of strings); it "
     "has 1 for 2 questions"),
    (kvpress_line(question=None, questions=["a?"], answers="x"), "it has no list for 1 questions"),
    (kvpress_line(question=None, questions=[], answers=[]), "'questions' must be a non-empty list of questions"),
    (kvpress_line(question=None, questions=["a?", " "], answers=[["x"], ["x"]]),
     "question 1 of 'questions' must be a non-empty string"),
    (kvpress_line(question=None, questions=["a?"], answers=[[]]), "line 1: question 0: the answers must be a string"),
    (kvpress_line(question=None, questions=["a?", "b?"], answers=[["x"], ["y"]]), "the answer 'y' does not occur"),
])
def test_bad_questions_name_their_line_and_what_to_fix(tmp_path: Path, line, message: str) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [line])
    with pytest.raises(SpectraError, match=re.escape(message)):
        read_records(path)
    assert is_task_file(path)
