"""The process's CPU threads: the usable CPUs, OMP_WAIT_POLICY set by the command line only before torch loads
and never over the user's own, torch's thread count set for a block and restored after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from spectra import runtime

ROOT = Path(__file__).resolve().parent.parent


def test_usable_cpus_is_the_affinity_mask() -> None:
    assert runtime.usable_cpus() == len(os.sched_getaffinity(0))


def test_passive_wait_only_before_torch_loads_and_never_over_the_user_s_choice() -> None:
    assert "torch" in sys.modules
    environ: dict[str, str] = {}
    assert not runtime.prefer_passive_wait(environ) and environ == {}, "too late: OpenMP has read its environment"
    code = ("import os, sys; from spectra import runtime; print(runtime.prefer_passive_wait(), "
            "os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(ROOT)
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert fresh.stdout.split() == ["True", "PASSIVE", "False"]
    mine = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**env, "OMP_WAIT_POLICY": "active"})
    assert mine.stdout.split() == ["False", "active", "False"]


def test_the_command_line_asks_for_passive_waiting_before_torch_loads() -> None:
    """`spectra` sets the policy in main(), before any command imports torch (OpenMP reads it once, at load)."""
    code = ("import os, sys; from spectra import cli; sys.argv = ['spectra', '--help']\n"
            "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print('RESULT', os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.splitlines()[-1] == "RESULT PASSIVE False"


def test_threads_sets_the_count_for_the_block_and_restores_it() -> None:
    before = torch.get_num_threads()
    with runtime.threads(None) as count:
        assert count == before == torch.get_num_threads()
    with runtime.threads(before + 1) as count:
        assert count == before + 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    try:
        with runtime.threads(before + 2):
            raise KeyError
    except KeyError:
        pass
    assert torch.get_num_threads() == before
