"""spectra/tasks/selection.py: the records a task study evaluates — the whole file by default; --tasks the records of
the tasks named, each keeping its line; --samples N spread evenly over the file's tasks, then each task's lengths,
seeded, with the tasks left out named."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from spectra.config import RunConfig
from spectra.errors import SpectraError
from spectra.kv.tasks import selection
from spectra.kv.tasks.records import read_records

import task_files


def test_samples_spread_evenly_over_tasks_then_lengths(tmp_path) -> None:
    rows = [row for task in ("a_task", "b_task") for row in task_files.records(count=6, task="passkey", seed=len(task))]
    for i, row in enumerate(rows):
        row["task"], row["length"] = ("niah_a", 100 + 100 * (i % 2)) if i < 6 else ("vt", 100)
    path = task_files.write(tmp_path / "t.jsonl", rows)
    assert selection.evaluated(RunConfig(data=str(path))) == read_records(path)  # no --samples: the whole file
    chosen = selection.evaluated(RunConfig(data=str(path), samples=5, seed=3))
    assert chosen == sorted(chosen, key=lambda record: record.example) and len(chosen) == 5
    by_task = Counter(record.task for record in chosen)
    assert sorted(by_task.values()) == [2, 3]
    assert {record.length for record in chosen if record.task == "niah_a"} == {100, 200}  # its share over its lengths
    assert chosen == selection.evaluated(RunConfig(data=str(path), samples=5, seed=3))  # seeded: a resume finds them
    assert any(selection.evaluated(RunConfig(data=str(path), samples=5, seed=seed)) != chosen for seed in range(4, 9))
    assert selection.left_out(RunConfig(data=str(path), samples=1, seed=3)) in (["niah_a"], ["vt"])
    assert selection.spread(7, [5, 1, 5], random.Random(0)) == [3, 1, 3]
    assert sorted(selection.spread(2, [3, 3, 3], random.Random(0))) == [0, 1, 1]


def test_tasks_keep_the_records_of_the_tasks_named_each_on_its_line(tmp_path) -> None:
    rows = task_files.records(count=9)
    for i, row in enumerate(rows):
        row["task"] = ("passkey", "niah_single_1", "niah_single_2")[i % 3]
    path = task_files.write(tmp_path / "t.jsonl", rows)
    config = RunConfig(data=str(path))
    chosen = selection.evaluated(config, ("niah_single_2", "passkey"))
    assert [(record.example, record.task) for record in chosen] == [
        (0, "passkey"), (2, "niah_single_2"), (3, "passkey"), (5, "niah_single_2"), (6, "passkey"),
        (8, "niah_single_2")]  # the file's order and lines, whatever the order named
    assert chosen == [record for record in read_records(path) if record.task != "niah_single_1"]
    sampled = selection.evaluated(RunConfig(data=str(path), samples=2, seed=1), ("niah_single_2", "passkey"))
    assert sorted(record.task for record in sampled) == ["niah_single_2", "passkey"]
    # --samples 1 leaves one of the two tasks named out, never the task not named
    assert selection.left_out(RunConfig(data=str(path), samples=1, seed=1), ("niah_single_2", "passkey")) in (
        ["passkey"], ["niah_single_2"])
    with pytest.raises(SpectraError, match="t.jsonl holds no record of vt, cwe .--tasks.; its tasks: passkey, "
                                           "niah_single_1, niah_single_2"):
        selection.evaluated(config, ("passkey", "vt", "cwe"))


def test_the_haystacks_of_the_records_evaluated(tmp_path) -> None:
    """run.json's `haystacks`: per haystack its name, sha256 and the tasks reading it, in the file's order; records
    that do not say (an older file) under None; tasks with no haystack (cwe) left out."""
    rows = task_files.records(count=6, task="passkey")
    for row, task, named in zip(rows, ("niah_single_2", "niah_single_2", "passkey", "niah_single_3", "cwe", "vt"),
                                (("prose.txt", "ab12"), ("prose.txt", "ab12"), ("noise", "cd34"), ("prose.txt", "ab12"),
                                 (None, None), None)):
        row["task"] = task
        if named is not None:
            row["haystack"], row["haystack_sha256"] = named
    path = task_files.write(tmp_path / "t.jsonl", rows)
    found = selection.haystacks(read_records(path))
    assert found == [{"name": "prose.txt", "sha256": "ab12", "tasks": ["niah_single_2", "niah_single_3"]},
                     {"name": "noise", "sha256": "cd34", "tasks": ["passkey"]},
                     {"name": None, "sha256": None, "tasks": ["vt"]}]
    assert selection.haystack_notice(found) == (
        "haystacks: niah_single_2, niah_single_3 read prose.txt (sha256 ab12…); passkey read noise (sha256 cd34…); vt: "
        "not recorded (a task file written before spectra named its haystack: its essay tasks read RULER's noise "
        "unless spectra tasks was given --haystack)")
    assert selection.haystack_notice([]) is None
