"""The committed comparisons with kvpress 0.5.5: answers compared and equal per press, loop, kind of records, ratio and
task file, merged run after run, and the leaderboard's column `= kvpress (cells)` read from them."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pandas as pd
import pytest

from spectra.errors import SpectraError
from spectra.report import equality

#: kvpress's answers as benchmarks/kvpress_check.py --tasks writes them (press, ratio, query_aware, example, question,
#: prediction, score): two records, knorm at two ratios, the full cache, both loops
KVPRESS = pd.DataFrame(
    [("full", 0.0, False, 0, 0, " 9220020.", 1.0), ("full", 0.0, False, 1, 0, " 41.", 1.0),
     ("knorm", 0.5, False, 0, 0, " 9220020.", 1.0), ("knorm", 0.5, False, 1, 0, " 41.", 1.0),
     ("knorm", 0.875, False, 0, 0, " 999.", 0.0), ("knorm", 0.875, False, 1, 0, " 7", 0.0),
     ("knorm", 0.5, True, 0, 0, " 9220020.", 1.0)],
    columns=["press", "ratio", "query_aware", "example", "question", "prediction", "score"])
#: spectra's per-example table of the question-free run: knorm at 0.875 answers the second record otherwise
SPECTRA = pd.DataFrame(
    [("full", 0.0, 0, 0, "9220020.", 1.0), ("full", 0.0, 1, 0, " 41.", 1.0), ("knorm", 0.5, 0, 0, " 9220020.", 1.0),
     ("knorm", 0.5, 1, 0, " 41. ", 1.0), ("knorm", 0.875, 0, 0, " 999.", 0.0), ("knorm", 0.875, 1, 0, " 8", 0.0)],
    columns=["press", "ratio", "example", "question", "prediction", "score"])


def test_answers_are_compared_after_strip_and_counted_per_press_and_ratio(tmp_path) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"context": "x"}\n')
    cells = equality.cells(KVPRESS, SPECTRA, query_aware=False)
    assert len(cells) == 6 and cells["equal"].tolist() == [True, True, True, True, True, False]
    rows = equality.counted(cells, False, equality.ONE, data, "0.5.5")
    assert list(rows.columns) == list(equality.COLUMNS)
    assert rows[["press", "ratio", "compared", "equal"]].values.tolist() == [
        ["full", 0.0, 2, 2], ["knorm", 0.5, 2, 2], ["knorm", 0.875, 2, 1]]
    assert set(rows["loop"]) == {"question-free"} and set(rows["data"]) == {"tasks.jsonl"}
    assert set(rows["data_sha256"]) == {hashlib.sha256(data.read_bytes()).hexdigest()}
    # the query-aware loop holds only knorm's one answer at 0.5, which the question-free run does not answer
    assert len(equality.cells(KVPRESS, SPECTRA, query_aware=True)) == 1


def test_the_table_merges_comparisons_and_a_repeated_one_replaces_its_rows(tmp_path) -> None:
    data, path = tmp_path / "tasks.jsonl", tmp_path / "results" / "kvpress-equality.csv"
    data.write_text("{}\n")
    assert equality.read(path).empty
    first = equality.counted(equality.cells(KVPRESS, SPECTRA, False), False, equality.ONE, data, "0.5.5")
    equality.record(path, first)
    bytes_once = path.read_bytes()
    equality.record(path, first)
    assert path.read_bytes() == bytes_once, "the same comparison again changes nothing"
    other = tmp_path / "more.jsonl"
    other.write_text("{ }\n")
    equality.record(path, first.assign(data="more.jsonl", data_sha256=hashlib.sha256(b"{ }\n").hexdigest()))
    table = equality.read(path)
    assert len(table) == 6
    column = equality.column(table, ["full", "knorm", "lowrank", "snapkv"], query_aware=False)
    assert column == {"full": "4/4", "knorm": "6/8", "lowrank": equality.ABSENT, "snapkv": equality.UNCOMPARED}
    assert equality.column(table, ["knorm"], query_aware=True) == {"knorm": equality.UNCOMPARED}
    assert equality.column(table, ["knorm"], False, equality.SEVERAL) == {"knorm": equality.UNCOMPARED}
    assert equality.equal_everywhere(table, ["full", "knorm", "snapkv"], False) == []
    fixed = first.assign(equal=first["compared"])  # knorm's 0.875 answers, compared again, now all equal
    table = equality.record(path, fixed)
    assert equality.column(table, ["knorm"], False) == {"knorm": "7/8"}
    table = equality.record(path, fixed.assign(data="more.jsonl", data_sha256=hashlib.sha256(b"{ }\n").hexdigest()))
    assert equality.equal_everywhere(table, ["full", "knorm", "snapkv"], False) == ["knorm"]


def test_peers_are_the_presses_kvpress_has() -> None:
    assert equality.peer("snapkv") == "SnapKVPress" and equality.peer("adakv(snapkv)") == "AdaKVPress"
    assert equality.peer("kvzap(artifacts/kvzap-linear)") == "KVzapPress"  # a path that need not exist here
    assert equality.peer("lowrank") == "" and equality.peer("kivi4") == "" and equality.peer("full")


def test_a_damaged_table_is_one_line(tmp_path) -> None:
    path = tmp_path / "kvpress-equality.csv"
    path.write_text("press,ratio\nknorm,0.5\n")
    with pytest.raises(SpectraError, match="has the columns press, ratio, not press, loop"):
        equality.read(path)


def test_the_benchmark_writes_the_table_from_a_comparison(tmp_path) -> None:
    """benchmarks/kvpress_tasks.py's `record_equality` (kvpress_check.py --equality), on recorded answers."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import kvpress_tasks

    from spectra.kv.tasks.records import read_records

    import task_files

    data = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=2))
    records = read_records(data)
    SPECTRA.to_csv(tmp_path / "task_examples.csv", index=False)
    ours = kvpress_tasks.spectra_answers(tmp_path / "task_examples.csv")  # " 41." stays text, not the number 41.0
    rows = kvpress_tasks.record_equality(tmp_path / "eq.csv", KVPRESS, ours, False, records, data, "0.5.5")
    assert rows["questions"].tolist() == [equality.ONE] * 3
    assert equality.read(tmp_path / "eq.csv")[["press", "compared", "equal"]].values.tolist() == [
        ["full", 2, 2], ["knorm", 2, 2], ["knorm", 2, 1]]
