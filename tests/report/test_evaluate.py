"""A task run read back from its files (predictions stay text) and printed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

import pytest

from spectra.errors import SpectraError
from spectra.report.evaluate import TaskRun, load, needle_vs_score, question_drop, show
from spectra.kv.tasks.summary import task_scores


def write_run(path) -> dict:
    examples = pd.DataFrame([{"press": press, "ratio": ratio, "example": example, "task": "passkey", "length": 1024,
                              "depth": np.nan if example == 2 else example / 2,
                              "prediction": "007" if press == "full" else "", "score": float(press == "full"),
                              "kept": 1 - ratio, "needle_kept": 1.0}
                             for press, ratio in (("full", 0.0), ("knorm", 0.5)) for example in range(3)])
    evicted = pd.DataFrame([{"press": "knorm", "ratio": 0.5, "example": 0, "task": "passkey", "length": 1024,
                             "depth": 0.0, "score": 0.0, "full": 1.0, "evicted": 2, "evicted_layers": "0,1",
                             "first_evicted": 0}])
    needle = pd.DataFrame([{"press": "full", "ratio": 0.0, "layer": 0, "head": 0, "needle_kept": 1.0,
                            "needle_kept_failed": np.nan, "failed": 0, "needle_mass": 0.2}])
    tables = {"task_examples.csv": examples, "task_scores.csv": task_scores(examples, 0, replicates=20),
              "task_lengths.csv": task_scores(examples, 0, ("task", "length"), replicates=20),
              "task_needle.csv": needle, "task_evicted.csv": evicted}
    for name, frame in tables.items():
        frame.to_csv(path / name, index=False)
    meta = {"kind": "evaluate", "model": {"name": "tiny"}, "data": {"name": "tasks.jsonl"},
            "examples": 3, "query_aware": False}
    (path / "run.json").write_text(json.dumps(meta))
    return tables


def test_a_task_run_reads_back_and_prints(tmp_path, capsys) -> None:
    tables = write_run(tmp_path)
    run = load(tmp_path, json.loads((tmp_path / "run.json").read_text()))
    assert run.examples["prediction"].tolist() == ["007"] * 3 + [""] * 3
    assert np.isnan(run.examples["depth"][2]) and run.examples["depth"][1] == 0.5
    assert run.evicted["evicted_layers"].tolist() == ["0,1"]
    pd.testing.assert_frame_equal(run.scores, tables["task_scores.csv"], check_dtype=False)
    show(run)
    printed = capsys.readouterr().out
    assert "3 examples" in printed and "knorm" in printed and "1 cell scored below the full cache" in printed


def test_needle_vs_score_is_a_rank_auc() -> None:
    rows = [{"press": "full", "ratio": 0.0, "example": e, "score": 1.0 if e < 4 else 0.0, "needle_kept": 1.0}
            for e in range(5)]
    kept = {0: (0.9, 1.0), 1: (0.2, 0.0), 2: (0.5, 1.0), 3: (0.5, 0.0), 4: (0.0, 0.0)}  # example: (kept, score)
    rows += [{"press": "knorm", "ratio": 0.5, "example": e, "score": score, "needle_kept": share}
             for e, (share, score) in kept.items()]
    rows += [{"press": "think", "ratio": 0.5, "example": e, "score": 1.0, "needle_kept": np.nan} for e in range(5)]
    run = TaskRun(None, {}, pd.DataFrame(rows), *[pd.DataFrame()] * 4)
    table = needle_vs_score(run).set_index("press")
    knorm = table.loc["knorm"]  # example 4 is left out: the full cache missed it
    assert (knorm["answered"], knorm["missed"]) == (2, 2)
    assert knorm["kept_answered"] == 0.7 and knorm["kept_missed"] == 0.35
    assert knorm["auc"] == (1 + 1 + 1 + 0.5) / 4
    assert "think" not in table.index and table.loc["all", "auc"] == knorm["auc"]


def test_a_press_without_a_needle_share_reads_back_as_a_number_and_prints(tmp_path, capsys) -> None:
    """A press that keeps no needle share (decoding(<scorer>): its cache changes while it answers) leaves the cell
    empty; the column still reads as numbers, so the needle-against-score summary prints."""
    write_run(tmp_path)
    examples = pd.read_csv(tmp_path / "task_examples.csv", dtype={"prediction": str}, keep_default_na=False)
    extra = examples[examples["press"] == "knorm"].assign(press="decoding(knorm)", needle_kept="")
    pd.concat([examples, extra]).to_csv(tmp_path / "task_examples.csv", index=False)
    run = load(tmp_path, json.loads((tmp_path / "run.json").read_text()))
    assert run.examples["needle_kept"].dtype == float
    assert run.examples["needle_kept"].isna().sum() == 3
    summary = needle_vs_score(run)
    assert "decoding(knorm)" not in set(summary["press"]), "no needle share: not in the needle-against-score rows"
    show(run)
    assert "does keeping the needle predict the answer?" in capsys.readouterr().out


def study_run(tmp_path) -> TaskRun:
    """Two tasks (the second with RULER's longest name), the full cache, knorm and decoding(knorm) at two ratios and
    kivi4, which ignores the ratio (the same answers at both), as a task run writes them."""
    rng = np.random.default_rng(3)
    cells = [("full", 0.0)] + [(press, ratio) for press in ("knorm", "kivi4", "decoding(knorm)") for ratio in (0.5, 0.75)]
    rows = []
    for example in range(8):
        task = "passkey" if example < 4 else "niah_multikey_1"
        kivi = float(rng.uniform() < 0.8)
        for press, ratio in cells:
            score = 1.0 if press == "full" else kivi if press == "kivi4" else float(rng.uniform() < 1 - ratio)
            rows.append({"press": press, "ratio": ratio, "example": example, "task": task, "length": 1024,
                         "depth": 0.5, "prediction": "x", "score": score, "needle_kept": np.nan,
                         "bytes_share": 1.0 if press == "full" else 0.28 if press == "kivi4" else 1 - ratio})
    examples = pd.DataFrame(rows)
    meta = {"kind": "evaluate", "model": {"name": "tiny"}, "data": {"name": "tasks.jsonl"},
            "examples": 8}
    return TaskRun(tmp_path, meta, examples, task_scores(examples, 0, replicates=50),
                   task_scores(examples, 0, ("task", "length"), replicates=50), pd.DataFrame(), pd.DataFrame())


def test_the_task_table_fits_80_columns_full_first_a_ratio_free_press_once(tmp_path, capsys, monkeypatch) -> None:
    """Issue 41: at 80 columns the task table split into three stacked parts, one holding delta_high alone (item
    14); `full` sorted between the presses (item 15); kivi4, which ignores the ratio, was printed once per ratio
    (item 10); and the run said "written to" its directory, then the command line "results in" it (item 15). Now
    one table per task, each whole within 80 columns: the full cache first, then the presses in the run's order,
    each score and its difference from the full cache with the interval; kivi4 in one row."""
    from report_helpers import printed_tables

    from spectra.report import console

    monkeypatch.setattr(console.out, "width", 80)
    run = study_run(tmp_path)
    show(run)
    printed = capsys.readouterr().out
    assert max(len(line) for line in printed.splitlines()) <= 80
    assert "written to" not in printed
    tables = printed_tables(printed)
    assert len(tables) == 2, "one whole table per task"
    scores = run.scores.set_index(["task", "press", "ratio"])
    for table, task in zip(tables, ("passkey", "niah_multikey_1")):
        assert table["header"] == [["press", "ratio", "score", "Δ vs full", "bytes"]]
        assert [row[:2] for row in table["rows"]] == [["full", "0.00"], ["knorm", "0.50"], ["knorm", "0.75"],
                                                     ["kivi4", "any"], ["decoding(knorm)", "0.50"],
                                                     ["decoding(knorm)", "0.75"]]
        for row in table["rows"]:
            press, ratio = row[0], 0.5 if row[1] == "any" else float(row[1])
            want = scores.loc[(task, press, ratio)]
            assert row[2] == f"{want['score']:.2f} [{want['low']:.2f}, {want['high']:.2f}]"
            delta = f"{want['delta']:+.2f} [{want['delta_low']:+.2f}, {want['delta_high']:+.2f}]"
            assert row[3] == ("" if press == "full" else delta)
            assert row[4] == f"{want['bytes_share']:.3f}"
    assert ("kivi4: the same at every ratio (0.5, 0.75), so one row each (ratio 'any'; task_scores.csv keeps a row "
            "per ratio)") in " ".join(printed.split())
    assert len(run.scores[run.scores["press"] == "kivi4"]) == 4, "the table keeps a row per ratio and task"


def test_a_run_without_bytes_names_no_press_ratio_free(tmp_path, capsys) -> None:
    """Without the bytes each cell stored, a press that ignores the ratio cannot be told from one that scored the same
    at each ratio (snapkv, keeping the same few answers): every ratio keeps its row."""
    from report_helpers import printed_tables

    run = study_run(tmp_path)
    run.scores["bytes_share"] = np.nan
    show(run)
    printed = capsys.readouterr().out
    rows = [row[:2] for row in printed_tables(printed)[0]["rows"]]
    assert ["kivi4", "0.50"] in rows and ["kivi4", "0.75"] in rows and "any" not in printed


def questions_run(aware: bool, scores: list[float], sha: str = "f") -> TaskRun:
    """A run of two records asking two questions each: the full cache answers all, knorm scores `scores`."""
    rows = [{"press": press, "ratio": ratio, "example": example, "question": question, "task": "kv_retrieval",
             "score": 1.0 if press == "full" else scores[2 * example + question], "needle_kept": 1.0}
            for press, ratio in (("full", 0.0), ("knorm", 0.5)) for example in range(2) for question in range(2)]
    meta = {"query_aware": aware, "data": {"sha256": sha, "name": "kv.jsonl"}, "settings": {"seed": 0},
            "model": {"name": "tiny"}}
    return TaskRun(Path("/nowhere") / ("aware" if aware else "once"), meta, pd.DataFrame(rows),
                   *[pd.DataFrame()] * 4)


def test_the_question_drop_pairs_a_query_aware_run_with_a_query_agnostic_one() -> None:
    in_view, once = questions_run(True, [1, 1, 1, 0]), questions_run(False, [1, 0, 0, 0])
    table = question_drop(in_view, once).set_index("press")
    assert table.loc["knorm", "in_view"] == 0.75 and table.loc["knorm", "once"] == 0.25
    assert table.loc["knorm", "drop"] == 0.5 and table.loc["knorm", "questions"] == 4
    assert table.loc["full", "drop"] == 0
    with pytest.raises(SpectraError, match="compares a --query-aware run"):
        question_drop(once, in_view)
    with pytest.raises(SpectraError, match="ran different task files"):
        question_drop(in_view, questions_run(False, [1, 0, 0, 0], sha="g"))
    rows = needle_vs_score(once).set_index("press")  # (example, question) pairs: each question its full answer
    assert (rows.loc["knorm", "answered"], rows.loc["knorm", "missed"]) == (1, 3)


def test_a_run_of_many_questions_prints_each_question(tmp_path, capsys) -> None:
    write_run(tmp_path)
    rows = questions_run(False, [1, 0, 0, 0]).examples.assign(length=1024, depth=0.5, prediction="x", kept=1.0)
    task_scores(rows, 0, ("task", "question"), replicates=20).to_csv(tmp_path / "task_questions.csv", index=False)
    show(load(tmp_path, json.loads((tmp_path / "run.json").read_text())))
    printed = capsys.readouterr().out
    assert "kv_retrieval: per question" in printed
