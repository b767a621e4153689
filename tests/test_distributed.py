"""torchrun with two CPU processes (gloo) gives the numbers of one process on the same sequences."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

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


#: run under torchrun: spectra.evaluate with a checkpoint after every example, process 1 killed (SIGKILL, as a crash)
#: right after its second shard is written
KILLED = """
import os, signal, sys
import spectra
from spectra import shards

saves, real = [], shards.Writer.save

def save(self, state):
    real(self, state)
    saves.append(sorted(self.indices))
    if os.environ["RANK"] == "1" and len(saves) == 2:
        os.kill(os.getpid(), signal.SIGKILL)

shards.Writer.save = save
model, task, out = sys.argv[1:]
spectra.evaluate(model, task, out=out, presses="knorm,snapkv,streaming", ratios="0.5", device="cpu",
                 checkpoint_seconds=0.0, progress=None, notify=lambda line: None)
"""

#: run under torchrun: the command line, each process sent SIGINT (as Ctrl-C sends it to all) after its first example
INTERRUPTED = """
import os, signal, sys
import torch.distributed
from spectra import shards
from spectra.cli import main

real = shards.Writer.add

def add(self, indices):
    real(self, indices)
    if len(self.indices) == 1:
        torch.distributed.barrier()  # both are on their first example: the signal reaches both at once, as Ctrl-C
        os.kill(os.getpid(), signal.SIGINT)

shards.Writer.add = add
sys.argv = ["spectra", *sys.argv[1:]]
main()
"""


def launch(script: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    """`script` (with `args`) in two torchrun processes (gloo); its exit status is the caller's to check."""
    (cwd / "launched.py").write_text(script)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join([str(Path(spectra.__file__).parent.parent), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), str(cwd / "launched.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def held(partial: Path) -> dict[int, set[int]]:
    """The sequences each process's shard holds, by the rank that wrote it."""
    found: dict[int, set[int]] = {}
    for path in sorted((partial / "shards").glob("*.npz")):
        with np.load(path, allow_pickle=False) as shard:
            rank = json.loads(str(shard["shard.meta"]))["rank"]
            found.setdefault(rank, set()).update(int(i) for i in shard["shard.indices"])
    return found


def test_a_process_killed_mid_run_resumes_with_one_process_or_two(chat_decoder, tmp_path) -> None:
    """Two processes checkpoint each example they finish into their own shard; process 1 is killed after its
    second. The run resumes with one process and, separately, with two: both skip every example a shard holds
    and combine the shards at the end, so the tables equal one process's uninterrupted run (the answers exactly,
    the float columns to float32 rounding, as above)."""
    task = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=8))
    settings = dict(presses="knorm,snapkv,streaming", ratios="0.5", device="cpu", notify=lambda line: None)
    whole = spectra.evaluate(str(chat_decoder), str(task), out=tmp_path / "whole", progress=None, **settings)

    killed = launch(KILLED, [str(chat_decoder), str(task), str(tmp_path / "cut")], tmp_path)
    assert killed.returncode != 0 and not (tmp_path / "cut").exists()
    found = held(tmp_path / "cut.partial")
    assert found[1] == {1, 3}, found  # process 1: examples 1 and 3, then killed
    assert found.get(0, set()) <= {0, 2, 4, 6}, found  # process 0: what it finished before torchrun stopped it
    shutil.copytree(tmp_path / "cut.partial", tmp_path / "one.partial")

    seen = []
    one = spectra.evaluate(str(chat_decoder), str(task), out=tmp_path / "one", resume=True,
                           progress=lambda done, total: seen.append(done), **settings)
    assert seen[0] == sum(map(len, found.values())) and seen[-1] == 8
    done = torchrun(["evaluate", str(chat_decoder), "--data", str(task), "--presses", settings["presses"],
                     "--ratios", settings["ratios"], "--out", str(tmp_path / "cut"), "--resume"], tmp_path)
    assert "resuming" in done.stdout + done.stderr and done.stdout.count("results in ") == 1
    two = spectra.load_run(tmp_path / "cut")
    for resumed, processes in ((one, 1), (two, 2)):
        assert resumed.meta["processes"] == processes and resumed.meta["examples"] == 8
        assert not (resumed.path / "shards").exists() and not resumed.path.with_name(resumed.path.name + ".partial").exists()
        assert (resumed.examples["prediction"] == whole.examples["prediction"]).all()
        for name in ("examples", "scores", "lengths", "needle", "evicted"):
            pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), rtol=1e-6, obj=name)


def test_an_interrupt_across_processes_checkpoints_each_and_names_the_checkpoint(chat_decoder, tmp_path) -> None:
    """Ctrl-C reaches every process: each writes its shard after the example it is on, exits 130 and says how to
    continue; one process then finishes the run to the uninterrupted tables."""
    task = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=6))
    settings = dict(presses="knorm,streaming", ratios="0.5", device="cpu", notify=lambda line: None)
    stopped = launch(INTERRUPTED, ["evaluate", str(chat_decoder), "--data", str(task), "--presses",
                                   settings["presses"], "--ratios", settings["ratios"], "--out",
                                   str(tmp_path / "cut"), "--device", "cpu"], tmp_path)
    partial = tmp_path / "cut.partial"
    lines = [line for line in stopped.stderr.splitlines() if line.startswith("interrupted after about ")]
    assert stopped.returncode != 0 and len(lines) == 2, stopped.stderr[-3000:]
    assert all(f"continue with --resume and the same --out ({tmp_path / 'cut'}) (each process's sequences are "
               f"checkpointed in {partial}; resume with one process or several)" in line for line in lines)
    assert stopped.stderr.count("exitcode  : 130") + stopped.stderr.count("exitcode: 130") >= 1, stopped.stderr[-3000:]
    assert held(partial) == {0: {0}, 1: {1}}
    whole = spectra.evaluate(str(chat_decoder), str(task), out=tmp_path / "whole", progress=None, **settings)
    resumed = spectra.evaluate(str(chat_decoder), str(task), out=tmp_path / "cut", resume=True, progress=None,
                               **settings)
    assert resumed.meta["examples"] == 6 and (resumed.examples["prediction"] == whole.examples["prediction"]).all()
    for name in ("examples", "scores", "needle"):
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), rtol=1e-6, obj=name)
