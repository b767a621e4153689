"""What the report pages' tests share: real task runs of the tiny chat decoder, two of one task file (a board) and one
of another, and an analyze run (a run of another command)."""

from __future__ import annotations

import pytest

import spectra
import task_files

QUIET = {"progress": None, "notify": lambda line: None}


def answered_by_anything(count: int) -> list[dict]:
    """`task_files.records` whose answer is the letter e, which most five-token answers of the tiny decoder's
    vocabulary hold: a random tiny model answers no needle, and a page ranks presses only on tasks its full cache
    answers."""
    return [{**row, "answers": ["e"]} for row in task_files.records(count=count)]


@pytest.fixture(scope="session")
def board_runs(chat_decoder, tmp_path_factory) -> list:
    """Two `spectra evaluate` runs of one task file, streaming in one and knorm in the other, at r = 0.5 and 0.75."""
    root = tmp_path_factory.mktemp("board")
    data = task_files.write(root / "tasks.jsonl", answered_by_anything(4))
    return [spectra.evaluate(str(chat_decoder), str(data), presses=press, ratios="0.5,0.75", out=root / press, **QUIET)
            for press in ("streaming", "knorm")]


@pytest.fixture(scope="session")
def other_file_run(chat_decoder, tmp_path_factory):
    """A run of another task file (three records): it does not pool with `board_runs`."""
    root = tmp_path_factory.mktemp("other")
    data = task_files.write(root / "other.jsonl", answered_by_anything(3))
    return spectra.evaluate(str(chat_decoder), str(data), presses="snapkv", ratios="0.5,0.75", out=root / "snapkv",
                            **QUIET)


@pytest.fixture(scope="session")
def analyze_run(llama_dir, text_file, tmp_path_factory):
    return spectra.analyze(str(llama_dir), str(text_file), length=32, samples=2,
                           out=tmp_path_factory.mktemp("analyzed") / "a", **QUIET)
