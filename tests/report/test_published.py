"""A task run's published form: its tables gzipped reproducibly beside its run.json, read back as the run itself (the
leaderboard pooled from published folders is the leaderboard pooled from the runs), every file checked against its
recorded sha256 first; an analyze run's: its per-head tables, read back for the bridge, refused where curves are
needed."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil

import numpy as np
import pandas as pd
import pytest

import spectra
from spectra.errors import SpectraError
from spectra.report import bridge, leaderboard, published, survival

import task_files
import tiny

QUIET = dict(progress=None, notify=lambda line: None)
TABLES = ("examples", "scores", "lengths", "needle", "evicted")


@pytest.fixture(scope="module")
def two_runs(chat_decoder, tmp_path_factory):
    """Two task runs of one tiny task file, each with its own presses: what a leaderboard pools."""
    root = tmp_path_factory.mktemp("published")
    data = task_files.write(root / "tasks.jsonl", task_files.records(count=3))
    return [spectra.evaluate(str(chat_decoder), str(data), presses=presses, ratios="0.5,0.75", out=root / name,
                             **QUIET)
            for name, presses in (("board-a", "knorm,snapkv"), ("board-b", "streaming"))]


@pytest.fixture(scope="module")
def folders(two_runs, tmp_path_factory):
    return published.publish([run.path for run in two_runs], tmp_path_factory.mktemp("results") / "board")


def test_a_published_run_reads_back_as_the_run_and_pools_alike(two_runs, folders) -> None:
    assert [folder.name for folder in folders] == ["board-a", "board-b"]
    again = [spectra.load_run(folder) for folder in folders]
    for run, copy in zip(two_runs, again):
        assert type(copy) is type(run) and copy.meta["published"]["run"] == run.path.name
        assert {key: value for key, value in copy.meta.items() if key != "published"} == run.meta
        for name in TABLES:
            pd.testing.assert_frame_equal(getattr(copy, name), getattr(run, name))
        # the uncompressed table is the run's own file, byte for byte
        for name, recorded in copy.meta["published"]["files"].items():
            plain = (run.path / name.removesuffix(".gz")).read_bytes()
            assert hashlib.sha256(plain).hexdigest() == recorded[published.PLAIN[name.endswith(".csv.gz")]]
            assert gzip.decompress((copy.path / name).read_bytes()) == plain
    examples, pooled = leaderboard.pooled(two_runs), leaderboard.pooled(again)
    pd.testing.assert_frame_equal(pooled, examples)
    pd.testing.assert_frame_equal(leaderboard.ranking(pooled, 0, over="all"), leaderboard.ranking(examples, 0, over="all"))
    pd.testing.assert_frame_equal(leaderboard.standings(pooled, 0, over="all"),
                                  leaderboard.standings(examples, 0, over="all"))
    pd.testing.assert_frame_equal(leaderboard.pooled_needle(again), leaderboard.pooled_needle(two_runs))
    pd.testing.assert_frame_equal(survival.pooled_evicted(again), survival.pooled_evicted(two_runs))


def test_the_same_run_publishes_the_same_bytes(two_runs, folders, tmp_path) -> None:
    second = published.publish([two_runs[0].path], tmp_path / "again")[0]
    for file in folders[0].iterdir():
        assert (second / file.name).read_bytes() == file.read_bytes(), file.name
    packed = (second / "task_examples.csv.gz").read_bytes()
    assert packed[4:8] == b"\0\0\0\0" and not packed[3] & 0x08  # gzip: modification time 0, no file name


def test_publishing_refuses_what_it_cannot_publish_before_writing_anything(two_runs, folders, tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(SpectraError, match="is a published run already"):
        published.publish([two_runs[0].path, folders[0]], out)
    assert not out.exists()
    broken = tmp_path / "broken"
    shutil.copytree(two_runs[0].path, broken)
    (broken / "task_needle.csv").unlink()
    with pytest.raises(SpectraError, match="task_needle.csv is missing"):
        published.publish([two_runs[1].path, broken], out)
    assert not out.exists()


@pytest.mark.parametrize("damage", ["changed", "truncated", "missing"])
def test_a_published_file_whose_sha256_differs_is_refused_in_one_line(folders, tmp_path, monkeypatch, capsys,
                                                                      damage) -> None:
    folder = tmp_path / "board-a"
    shutil.copytree(folders[0], folder)
    file = folder / "task_examples.csv.gz"
    recorded = json.loads((folder / "run.json").read_text())["published"]["files"][file.name]["sha256"]
    if damage == "changed":  # the same table, one answer edited, compressed as publishing compresses
        text = gzip.decompress(file.read_bytes()).decode()
        file.write_bytes(published.compressed(text.replace("\n", "\n ", 1).encode()))
    elif damage == "truncated":
        file.write_bytes(file.read_bytes()[:-10])
    else:
        file.unlink()
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(SpectraError) as refused:
        spectra.load_run(folder)
    message = str(refused.value)
    assert "\n" not in message and str(file) in message and recorded[:published.SHOWN] in message
    assert "publish the run again" in message and f"--out {tmp_path}" in message
    if damage != "missing":
        assert hashlib.sha256(file.read_bytes()).hexdigest()[:published.SHOWN] in message
    code, out, err = tiny.run_cli(["evaluate", str(folder)], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {file}") and "Traceback" not in err
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before  # nothing written


def test_the_command_publishes_and_says_where(two_runs, tmp_path, monkeypatch, capsys) -> None:
    code, out, err = tiny.run_cli(["publish", str(two_runs[1].path), "--out", str(tmp_path / "r")], monkeypatch,
                                  capsys)
    assert code == 0 and f"wrote {tmp_path / 'r' / 'board-b'}" in out
    first = (tmp_path / "r" / "board-b" / "task_examples.csv.gz").read_bytes()
    (tmp_path / "r" / "board-b" / "task_examples.csv.gz").write_bytes(b"damaged")
    code, out, err = tiny.run_cli(["publish", str(two_runs[1].path), "--out", str(tmp_path / "r")], monkeypatch,
                                  capsys)
    assert code == 0 and (tmp_path / "r" / "board-b" / "task_examples.csv.gz").read_bytes() == first, "mended"
    code, out, err = tiny.run_cli(["publish", str(tmp_path / "r" / "board-b"), "--out", str(tmp_path / "s")],
                                  monkeypatch, capsys)
    assert code == 2 and "is a published run already" in err and err.count("\n") == 1


def test_an_analyze_run_publishes_its_per_head_tables_not_its_curves(chat_decoder, text_file, tmp_path, monkeypatch,
                                                                       capsys) -> None:
    run = spectra.analyze(str(chat_decoder), str(text_file), length=32, samples=2, out=tmp_path / "analyze", **QUIET)
    folder = published.publish([run.path], tmp_path / "results")[0]
    assert sorted(path.name for path in folder.iterdir()) == ["metrics.csv.gz", "qkv.csv.gz", "run.json"]
    tables = spectra.load_run(folder)
    assert type(tables).__name__ == "Tables" and tables.meta["published"]["run"] == "analyze"
    pd.testing.assert_frame_equal(tables.metrics, run.metrics)
    pd.testing.assert_frame_equal(tables.qkv, run.qkv)
    pd.testing.assert_frame_equal(bridge.spectrum_measures(tables), bridge.spectrum_measures(run))
    with pytest.raises(SpectraError, match="is a published analyze run: it holds the run's tables, not the arrays"):
        spectra.load_run(folder, "analyze")
    for command in (["plot", str(folder)], ["analyze", str(folder)]):
        code, out, err = tiny.run_cli(command, monkeypatch, capsys)
        assert code == 2 and err.count("\n") == 1 and "give its run directory" in err and "Traceback" not in err
    (folder / "qkv.csv.gz").write_bytes(b"changed")
    with pytest.raises(SpectraError, match="qkv.csv.gz has sha256"):
        spectra.load_run(folder)


def test_a_task_run_publishes_its_needle_arrays(two_runs, folders) -> None:
    for run, folder in zip(two_runs, folders):
        mine, theirs = run.arrays(), spectra.load_run(folder).arrays()
        assert mine.keys() == theirs.keys()
        for name in mine:
            np.testing.assert_array_equal(theirs[name], mine[name])
        recorded = json.loads((folder / "run.json").read_text())["published"]["files"]["needle.npz.gz"]
        assert recorded["npz_sha256"] == hashlib.sha256((run.path / "needle.npz").read_bytes()).hexdigest()
