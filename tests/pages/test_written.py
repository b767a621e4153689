"""`spectra <page> RUN… --out DIR` end to end on real task runs of the tiny decoder: each page's markdown, picture and
table written into DIR, their numbers recounted from the runs' own CSV files; bad input one line, exit code 2, nothing
written and no bootstrap started."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from spectra.report import leaderboard
from tiny import run_cli

PNG = b"\x89PNG\r\n\x1a\n"


def examples_of(runs: list) -> pd.DataFrame:
    """The runs' per-example rows read straight from their task_examples.csv (the full cache's once)."""
    frames = [pd.read_csv(Path(run.path) / "task_examples.csv") for run in runs]
    return pd.concat([frames[0], *(frame[frame["press"] != "full"] for frame in frames[1:])], ignore_index=True)


def test_the_leaderboard_command_writes_its_page_picture_and_table(board_runs, tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "page"
    code, said, err = run_cli(["leaderboard", *(str(run.path) for run in board_runs), "--out", str(out)], monkeypatch,
                              capsys)
    assert code == 0, err
    assert sorted(path.name for path in out.iterdir()) == ["leaderboard.csv", "leaderboard.md", "leaderboard.png"]
    assert [line for line in said.splitlines()] == [f"wrote {out / name}" for name in
                                                    ("leaderboard.md", "leaderboard.png", "leaderboard.csv")]
    assert (out / "leaderboard.png").read_bytes().startswith(PNG)
    table = pd.read_csv(out / "leaderboard.csv")
    examples = examples_of(board_runs)
    tasks, _ = leaderboard.held(examples)
    held = examples[examples["task"].isin(tasks)]
    means = table[table["ratio"] == "mean"].set_index("press")["score"]
    for press in ("full", "streaming", "knorm"):  # the mean over ratios: per example its ratios' mean, then the mean
        expected = held[held["press"] == press].groupby("example")["score"].mean().mean()
        assert means[press] == pytest.approx(expected, abs=1e-12), press
    cells = table[table["ratio"] != "mean"].astype({"ratio": float}).set_index(["press", "ratio"])["score"]
    for (press, ratio), rows in held[held["press"] != "full"].groupby(["press", "ratio"]):
        assert cells[(press, ratio)] == pytest.approx(rows["score"].mean(), abs=1e-12)
    ranked = table.drop_duplicates("press").set_index("press")["rank"]
    better = means.drop("full").idxmax()
    assert ranked[better] == 1
    text = (out / "leaderboard.md").read_text()
    assert text.startswith("# Task runs of one task file pooled") and "![" in text and "(leaderboard.png)" in text
    assert "| rank | tier | press | r = 0.5 | r = 0.75 | mean over r |" in text and "{" not in text
    assert f"`{better}`" in text and "runs pooled: 2." in text and "`first-below-full`" in text


@pytest.mark.parametrize("page, files", [("questions", "questions"), ("survival", "survival")])
def test_the_other_board_pages_write_theirs(board_runs, tmp_path, monkeypatch, capsys, page, files) -> None:
    out = tmp_path / page
    code, said, err = run_cli([page, *(str(run.path) for run in board_runs), "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err
    assert sorted(path.name for path in out.iterdir()) == [f"{files}.{suffix}" for suffix in ("csv", "md", "png")]
    assert (out / f"{files}.png").read_bytes().startswith(PNG) and "{" not in (out / f"{files}.md").read_text()
    table = pd.read_csv(out / f"{files}.csv")
    examples = examples_of(board_runs)
    if page == "survival":  # at r = 0.5, over the held tasks' examples the full cache answers: how many each kept
        full = examples[(examples["press"] == "full") & (examples["score"] >= 1)]
        full = full[full["task"].isin(leaderboard.held(examples)[0])]
        for row in table.itertuples():
            mine = examples[(examples["press"] == row.press) & (examples["ratio"] == 0.5)
                            & examples["example"].isin(full["example"])]
            assert (row.answered, row.kept) == (len(mine), int((mine["score"] >= 1).sum())), row.press
    else:  # on the questions the full cache answers, the share of them each press keeps
        answered = examples[(examples["press"] == "full") & (examples["score"] >= 1)]["example"]
        kept = examples[examples["example"].isin(answered) & (examples["press"] != "full")]
        cells = table[table["ratio"] != "mean"].astype({"ratio": float}).set_index(["press", "ratio"])["score"]
        for (press, ratio), rows in kept.groupby(["press", "ratio"]):
            assert cells[(press, ratio)] == pytest.approx(rows["score"].mean(), abs=1e-12)


def test_the_task_scores_page_reads_one_run(board_runs, tmp_path, monkeypatch, capsys) -> None:
    """Named task-scores: `spectra tasks` writes task files."""
    out = tmp_path / "scores"
    run = board_runs[1]
    code, _, err = run_cli(["task-scores", str(run.path), "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err
    table = pd.read_csv(out / "task-scores.csv").set_index(["press", "ratio"])["score"]
    examples = examples_of([run])
    for (press, ratio), rows in examples.groupby(["press", "ratio"]):
        assert table[(press, ratio)] == pytest.approx(rows["score"].mean(), abs=1e-12)
    assert "| press | r = 0.5 | r = 0.75 |" in (out / "task-scores.md").read_text()


@pytest.fixture
def no_bootstrap(monkeypatch) -> None:
    """Bad input is refused before any ranking is bootstrapped: a ranking started here fails the test."""
    def refused(*args, **kwargs):
        raise AssertionError("a ranking was bootstrapped before the input was checked")

    monkeypatch.setattr(leaderboard, "ranking", refused)
    monkeypatch.setattr(leaderboard, "standings", refused)


@pytest.mark.parametrize("case, message", [
    ("analyze", "is a run of spectra analyze; spectra leaderboard reads task runs of spectra evaluate"),
    ("other-file", "differ in their task file"),
    ("nowhere", "is not a spectra run directory"),
    ("out-file", "is a file; give the folder the page is written into"),
    ("two-for-one", "spectra task-scores reads one task run, got 2"),
    ("ratio", "--ratio 0.6: the runs measured the ratios 0.5, 0.75; give one of them"),
])
def test_bad_input_is_one_line_exit_code_2_and_nothing_written(board_runs, other_file_run, analyze_run, tmp_path,
                                                               monkeypatch, capsys, no_bootstrap, case,
                                                               message) -> None:
    board = [str(run.path) for run in board_runs]
    out = tmp_path / "out"
    arguments = {"analyze": ["leaderboard", board[0], str(analyze_run.path)],
                 "other-file": ["leaderboard", *board, str(other_file_run.path)],
                 "nowhere": ["questions", str(tmp_path / "nowhere")],
                 "out-file": ["survival", *board],
                 "two-for-one": ["task-scores", *board],
                 "ratio": ["survival", *board, "--ratio", "0.6"]}[case]
    if case == "out-file":
        out.write_text("")
    before = sorted(path.name for path in tmp_path.rglob("*"))
    code, said, err = run_cli([*arguments, "--out", str(out)], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert sorted(path.name for path in tmp_path.rglob("*")) == before, "nothing may be written"


def test_no_runs_is_a_usage_error(tmp_path, monkeypatch, capsys) -> None:
    code, _, err = run_cli(["leaderboard", "--out", str(tmp_path / "out")], monkeypatch, capsys)
    assert code == 2 and "Missing argument" in err and not (tmp_path / "out").exists()
