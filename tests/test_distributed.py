"""torchrun with two CPU processes (gloo) gives the numbers of one process on the same sequences."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import task_files
from frames import assert_frames_close
from references import eager_ranks, poisson_replicates

import spectra
from spectra.api import approx

pytestmark = pytest.mark.slow  # two processes each (torchrun, gloo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), "-m", "spectra", *args, "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_two_processes_equal_one(roberta_dir, text_file, tmp_path) -> None:
    common = ["--data", str(text_file), "--length", "24", "--samples", "7", "--batch-size", "2", "--mode", "truncate"]
    done = torchrun(["analyze", str(roberta_dir), *common, "--out", str(tmp_path / "two")], tmp_path)
    assert done.stdout.count("results in ") == 1, "only process 0 prints"
    two = spectra.load_run(tmp_path / "two")
    one = spectra.analyze(str(roberta_dir), str(text_file), length=24, samples=7, batch_size=2, mode="truncate",
                          device="cpu", out=tmp_path / "one", progress=None, notify=lambda line: None)
    assert two.meta["processes"] == 2 and two.meta["samples"] == 7
    assert np.abs(two.cum_mean - one.cum_mean).max() <= 1e-9
    assert np.abs(two.cum_std - one.cum_std).max() <= 1e-9
    numeric = one.metrics.select_dtypes("number").columns
    assert np.abs(two.metrics[numeric].to_numpy() - one.metrics[numeric].to_numpy()).max() <= 1e-9

    # one sequence per batch, so the float32 forward passes are the same in both runs, row for row
    single = ["--data", str(text_file), "--length", "24", "--samples", "5", "--batch-size", "1"]
    torchrun(["approx", str(roberta_dir), *single, "--budget", "4,8", "--methods", "svd,jl,pool-mean", "--end-to-end",
              "--out", str(tmp_path / "approx-two")], tmp_path)
    two = spectra.load_run(tmp_path / "approx-two")
    one = approx(str(roberta_dir), str(text_file), length=24, samples=5, batch_size=1,
                 budget=[4, 8], methods=["svd", "jl", "pool-mean"], end_to_end=True, device="cpu",
                 out=tmp_path / "approx-one", progress=None, notify=lambda line: None)
    for table in ("head_stats", "end_to_end"):
        assert_frames_close(getattr(two, table), getattr(one, table), rtol=1e-9, atol=1e-9, name=table)


def test_two_processes_draw_the_same_projections_per_sequence(roberta_dir, text_file, tmp_path) -> None:
    """Theorem tables with a fresh R per sequence (and two draws each), seeded by the global sequence index:
    two processes taking alternate sequences give the single-process numbers."""
    single = ["--data", str(text_file), "--length", "16", "--samples", "5", "--batch-size", "1"]
    torchrun(["theorems", str(roberta_dir), *single, "--budget", "4,8", "--eps", "0.3,0.5", "--draws", "2",
              "--out", str(tmp_path / "two")], tmp_path)
    two = spectra.load_run(tmp_path / "two")
    one = spectra.theorems(str(roberta_dir), str(text_file), length=16, samples=5, batch_size=1, budget=[4, 8],
                           eps=[0.3, 0.5], draws=2, device="cpu", out=tmp_path / "one", progress=None,
                           notify=lambda line: None)
    assert two.meta["processes"] == 2
    for name, table in one.tables.items():
        assert_frames_close(two.tables[name], table, rtol=1e-9, atol=1e-9, name=name)


@pytest.mark.slow
def test_two_processes_keep_the_bootstrap_of_one(roberta_dir, text_file, tmp_path) -> None:
    """Bootstrap replicates weight each sequence by draws seeded by its global index: two processes taking alternate
    sequences give bitwise the single-process replicates (integer ranks and weights: exact sums in any order)."""
    common = ["--data", str(text_file), "--length", "24", "--samples", "8", "--batch-size", "2", "--bootstrap", "30"]
    torchrun(["analyze", str(roberta_dir), *common, "--out", str(tmp_path / "two")], tmp_path)
    two = spectra.load_run(tmp_path / "two")
    one = spectra.analyze(str(roberta_dir), str(text_file), length=24, samples=8, batch_size=2, bootstrap=30,
                          device="cpu", out=tmp_path / "one", progress=None, notify=lambda line: None)
    assert two.meta["processes"] == 2
    replicates = [np.load(run.path / "bootstrap.npz", allow_pickle=False)["replicates"] for run in (two, one)]
    assert replicates[1].shape == (30, 2, 4, 2) and np.isfinite(replicates[1]).all()
    assert np.array_equal(*replicates)
    want = poisson_replicates(eager_ranks(roberta_dir, text_file, 24, 8), 30)  # independent: eager + scipy
    assert np.allclose(replicates[0], want, rtol=1e-12, atol=0)


def test_a_checkpoint_of_one_process_resumes_across_two(chat_decoder, tmp_path) -> None:
    """A task run stopped in one process after 2 of its 5 records, resumed by two (gloo): the first takes the
    checkpoint's state, both skip its records and take the rest alternately. The tables equal one process's
    uninterrupted run: the answers exactly, the float columns to float32 rounding (each process runs one thread)."""
    task = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=5))
    settings = dict(presses="knorm,snapkv,streaming", ratios="0.5", device="cpu", notify=lambda line: None)
    whole = spectra.evaluate(str(chat_decoder), str(task), out=tmp_path / "whole", progress=None, **settings)

    class Stop(Exception):
        pass

    def interrupt(done: int, total: int) -> None:
        if done >= 2:
            raise Stop

    with pytest.raises(Stop):
        spectra.evaluate(str(chat_decoder), str(task), out=tmp_path / "cut", progress=interrupt,
                         checkpoint_seconds=0.0, **settings)
    done = torchrun(["evaluate", str(chat_decoder), "--data", str(task), "--presses", settings["presses"],
                     "--ratios", settings["ratios"], "--out", str(tmp_path / "cut"), "--resume"], tmp_path)
    assert "resuming" in done.stdout + done.stderr and done.stdout.count("results in ") == 1
    two = spectra.load_run(tmp_path / "cut")
    assert two.meta["processes"] == 2 and two.meta["examples"] == 5 and not (tmp_path / "cut.partial").exists()
    assert (two.examples["prediction"] == whole.examples["prediction"]).all()
    for name in ("examples", "scores", "lengths", "needle", "evicted"):
        pd.testing.assert_frame_equal(getattr(two, name), getattr(whole, name), rtol=1e-6, obj=name)
