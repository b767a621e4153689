"""Writing a run directory: nothing appears before the first checkpoint, results replace a run only when
whole, a lock keeps a second writer out, files get the umask's permissions, unwritable places are refused early."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectra import rundir, runs
from spectra.errors import SpectraError


def test_a_run_appears_only_when_finished(tmp_path) -> None:
    target = rundir.RunDir(tmp_path / "run")
    target.begin({"kind": "analyze"})
    assert not (tmp_path / "run.partial").exists(), "nothing touches the disk before the first checkpoint"
    target.save_checkpoint({"a.total": np.arange(3.0)}, 5, wall_seconds=1.5)
    state, done = target.load_checkpoint()
    assert done == 5 and np.array_equal(state["a.total"], np.arange(3.0))
    assert json.loads((tmp_path / "run.partial" / "run.json").read_text())["status"] == "running"
    frame = pd.DataFrame({"layer": [0, 1], "value": [0.1, 1 / 3]})
    out = target.finish({"kind": "x", "status": "complete"}, {"t.csv": frame}, {"a.npz": {"x": np.eye(2)}})
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"] and out == tmp_path / "run"
    assert pd.read_csv(out / "t.csv").equals(frame), "floats round-trip exactly through the CSV"
    assert np.array_equal(runs.read_arrays(out / "a.npz")["x"], np.eye(2))
    assert not (out / rundir.CHECKPOINT).exists()


def test_existing_and_interrupted_runs_need_a_decision(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(SpectraError, match="already exists; pass overwrite=True"):
        rundir.RunDir(tmp_path / "run")
    (tmp_path / "other.partial").mkdir()
    with pytest.raises(SpectraError, match="an interrupted run is at .*resume=True") as raised:
        rundir.RunDir(tmp_path / "other")
    assert raised.value.for_cli().endswith("pass --resume to continue it or --overwrite to start over")
    (tmp_path / "file").write_text("")
    with pytest.raises(SpectraError, match="exists and is not a directory"):
        rundir.RunDir(tmp_path / "file")


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path) -> None:
    import os

    first = rundir.RunDir(tmp_path / "runs" / "run")
    with first.claimed():
        assert (tmp_path / "runs" / ".run.lock").read_text().strip() == str(os.getpid())
        with pytest.raises(SpectraError, match=f"being written by another spectra run \\(process {os.getpid()}\\)"):
            rundir.RunDir(tmp_path / "runs" / "run")
        with pytest.raises(SpectraError, match="being written by another spectra run"):
            with rundir.RunDir(tmp_path / "runs" / "run", overwrite=True).claimed():
                pass
    assert not (tmp_path / "runs" / ".run.lock").exists(), "the lock goes with the run"
    with rundir.RunDir(tmp_path / "runs" / "run").claimed():
        pass


def test_the_target_is_checked_again_once_the_lock_is_held(tmp_path) -> None:
    """A run that finished after this one's set-up and before its lock (issue 41, defect 3) is seen under the lock."""
    target = rundir.RunDir(tmp_path / "run")
    (tmp_path / "run").mkdir()  # another run finished meanwhile
    with pytest.raises(SpectraError, match="run directory .*run already exists; pass overwrite=True"):
        with target.claimed():
            pytest.fail("the lock was taken over a run it may not replace")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"], "no lock file is left behind"
    with rundir.RunDir(tmp_path / "run", overwrite=True).claimed():
        pass


def test_a_refused_run_leaves_no_directory_its_lock_needed(tmp_path) -> None:
    with pytest.raises(SpectraError, match="bad input found once the model loaded"):
        with rundir.RunDir(tmp_path / "new" / "deeper" / "run").claimed():
            assert (tmp_path / "new" / "deeper" / ".run.lock").exists()
            raise SpectraError("bad input found once the model loaded")
    assert list(tmp_path.iterdir()) == []


def test_a_lock_file_removed_by_its_finishing_holder_is_opened_afresh(tmp_path, monkeypatch) -> None:
    """The holder removes its lock file as its run ends: a run that opened the old file just before, and locks it
    just after, would hold a lock no later run sees. It opens the file again instead."""
    import os

    lock, flock, removed = tmp_path / ".run.lock", rundir.fcntl.flock, []

    def holder_finishes_meanwhile(handle, operation) -> None:
        flock(handle, operation)
        if not removed and operation & rundir.fcntl.LOCK_EX:
            removed.append(lock)
            lock.unlink()

    monkeypatch.setattr(rundir.fcntl, "flock", holder_finishes_meanwhile)
    with rundir.RunDir(tmp_path / "run").claimed():
        assert removed and lock.exists() and lock.read_text().strip() == str(os.getpid())
        monkeypatch.setattr(rundir.fcntl, "flock", flock)
        assert rundir.lock_holder(tmp_path / "run") == str(os.getpid()), "the lock the next run sees is held"


def test_files_follow_the_umask(tmp_path) -> None:
    import os

    old = os.umask(0o022)
    rundir._file_mode.cache_clear()
    try:
        rundir.write_json(tmp_path / "a.json", {"x": 1})
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
        rundir._file_mode.cache_clear()


def test_an_unwritable_place_is_refused_before_any_work(tmp_path, monkeypatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    # root may write anywhere, so the permission is taken away by the check's own question
    monkeypatch.setattr(rundir.os, "access", lambda path, mode: Path(path) != locked)
    with pytest.raises(SpectraError, match=f"cannot write .*: {locked} is not a writable directory; choose another"):
        rundir.RunDir(locked / "deeper" / "run")
    assert list(locked.iterdir()) == []
    rundir.RunDir(tmp_path / "fine" / "run")


def test_default_names_are_unique_per_model(tmp_path) -> None:
    base = tmp_path / "model-corpus-n32"
    assert rundir.default_dir(base, "/a/model") == base
    base.mkdir()
    (base / "run.json").write_text(json.dumps({"model": {"source": "/a/model"}}))
    assert rundir.default_dir(base, "/a/model") == base, "the same model finds its run again"
    assert rundir.default_dir(base, "/b/model") == tmp_path / "model-corpus-n32-2"


def test_a_tsv_table_is_a_bare_tab_separated_matrix(tmp_path) -> None:
    """DuoAttention and kvpress read full_attention_heads.tsv with np.loadtxt(delimiter="\\t"): no header, no index."""
    from spectra.rundir import write_table

    frame = pd.DataFrame([[1.0, 0.0, 1 / 3], [0.0, 1.0, 0.25]])
    write_table(tmp_path / "full_attention_heads.tsv", frame)
    lines = (tmp_path / "full_attention_heads.tsv").read_text().splitlines()
    assert len(lines) == 2 and all(line.count("\t") == 2 for line in lines)
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "full_attention_heads.tsv", delimiter="\t"), frame.to_numpy())


def test_a_directory_that_refuses_new_files_is_refused_though_its_permissions_allow(tmp_path, monkeypatch) -> None:
    """Permissions do not tell /proc, /sys or a read-only file system (root passes every permission check): the
    check creates a probe file, and a refusal there is one line; where it succeeds the probe is gone again."""
    refusing = tmp_path / "refusing"
    refusing.mkdir()
    real = rundir.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if Path(dir) == refusing:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(rundir.tempfile, "mkstemp", mkstemp)
    with pytest.raises(SpectraError, match=f"cannot write .*: {refusing} is not a writable directory; choose another"):
        rundir.check_writable(refusing / "run")
    rundir.check_writable(tmp_path / "fine" / "deeper")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["refusing"]
    (tmp_path / "figures.png").write_text("")
    with pytest.raises(SpectraError, match="it is a file, not a directory"):
        rundir.check_writable(tmp_path / "figures.png", inside=True)
