"""Stage timings: exclusive times of nested stages (on a scripted clock), threads adding up, what run.json
records for a real run and the line printed at its end."""

from __future__ import annotations

import json
import threading
import time

import pytest

import spectra
from spectra import timings
from spectra.report import analyze, console

QUIET = dict(progress=None, notify=lambda line: None)


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """A clock the test sets by hand: now[0] is the time."""
    now = [0.0]
    monkeypatch.setattr(timings, "_clock", lambda: now[0])
    return now


def test_an_inner_stage_is_taken_out_of_the_outer_one(clock) -> None:
    recorder = timings.Timings()
    with recorder.stage("forward"):
        clock[0] = 2.0
        with recorder.stage("spectra"):
            clock[0] = 5.0
            with recorder.stage("spectra"):  # the same stage nested: counted once
                clock[0] = 6.0
        clock[0] = 10.0
        assert recorder.seconds() == {"forward": 6.0, "spectra": 4.0}  # the open stage up to now
    clock[0] = 11.0
    assert recorder.seconds() == {"forward": 6.0, "spectra": 4.0}


def test_stages_mark_the_recording_run_only(clock) -> None:
    with timings.stage("forward"):  # nothing records: a no-op
        clock[0] = 1.0
    with timings.recording() as outer:
        with timings.recording() as inner, timings.stage("forward"):
            clock[0] = 3.0
        with timings.stage("load"):
            clock[0] = 4.0
    assert inner.seconds() == {"forward": 2.0} and outer.seconds() == {"load": 1.0}


def test_timed_and_staged_count_what_they_wrap(clock) -> None:
    def produce():
        for item in "ab":
            clock[0] += 1.0  # producing an item takes a second
            yield item

    def work(item: str) -> str:
        clock[0] += 10.0
        return item.upper()

    with timings.recording() as recorder:
        got = []
        for item in timings.timed("tokenize", produce()):
            with timings.stage("forward"):
                got.append(work(item))
    assert got == ["A", "B"] and recorder.seconds() == {"tokenize": 2.0, "forward": 20.0}


def test_threads_add_up() -> None:
    recorder = timings.Timings()

    def work() -> None:
        with recorder.stage("spectra"):
            time.sleep(0.05)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert recorder.seconds()["spectra"] >= 0.15  # each thread's own 0.05 s, on its own stack


def test_report_and_summary(clock) -> None:
    recorder = timings.Timings()
    for name, seconds in (("write", 0.5), ("spectra", 8.0), ("load", 2.0), ("forward", 4.0), ("extra", 1.0)):
        recorder.add(name, seconds)
    report = recorder.report(sequences=4)
    assert list(report["seconds"]) == ["load", "forward", "spectra", "write", "extra"]
    assert report["sequences"] == 4 and report["per_sequence"] == {"forward": 1.0, "spectra": 2.0}
    line = timings.summary(report)
    assert line.startswith("time 15.5 s; 3 s per sequence (forward 1, spectra 2); load 2.0 s; write 0.5 s")
    assert timings.summary(None) == "" and timings.summary({}) == ""
    assert timings.Timings().report(0) == {"seconds": {}, "sequences": 0, "per_sequence": {}}


@pytest.mark.parametrize("overlap", [False, True])
def test_a_run_records_its_stages_and_prints_them(roberta_dir, text_file, tmp_path, overlap: bool) -> None:
    """run.json's timings: every stage of a run, sequences this session, per-sequence seconds; on the loop's
    thread the stages of the streaming part fit in the run's wall time. With --overlap the spectra run on the
    worker and the loop's waits are counted."""
    run = spectra.analyze(str(roberta_dir), str(text_file), length=16, samples=5, batch_size=2, overlap=overlap,
                          out=tmp_path / "run", **QUIET)
    record = json.loads((tmp_path / "run" / "run.json").read_text())["timings"]
    seconds = record["seconds"]
    assert {"load", "tokenize", "forward", "spectra", "probes", "wait", "write"} <= set(seconds)
    assert all(value >= 0 for value in seconds.values()) and record["sequences"] == 5
    assert record["per_sequence"]["spectra"] == pytest.approx(seconds["spectra"] / 5, abs=3e-5)  # both rounded
    streaming = sum(seconds[name] for name in ("tokenize", "forward", "probes", "wait"))
    if not overlap:  # the spectra ran on the loop's thread too
        streaming += seconds["spectra"]
    assert streaming <= run.meta["wall_seconds"] + 1e-3
    with console.out.capture() as captured:
        analyze.show(run)
    # the console folds prose to the terminal's width (issue 33, defect 11): the words, in order, are the summary's
    assert " ".join(timings.summary(record).split()) in " ".join(captured.get().split())
