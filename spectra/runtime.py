"""The CPU threads a run uses, and how they wait: what keeps a run from collapsing beside another CPU-heavy process.

torch's intra-op threads are an OpenMP team. When a team has more threads than the CPUs free to run them (another
heavy process on the same cores), every parallel region waits at its barrier for a thread that is not running,
and libgomp's default wait policy makes the threads that arrived first spin on the CPU meanwhile, taking it from
the one they wait for and from the neighbour. benchmarks/threads.py measures it (benchmarks/RESULTS.md, section 8).

- The thread count: torch already starts one intra-op thread per CPU the process may use (its OpenMP reads the
  affinity mask, `len(os.sched_getaffinity(0))`: `taskset -c 0` gives one); `--threads N` (`threads=N`) sets
  another count for the run and gives the old one back afterwards.
- The wait policy: `spectra` on the command line sets `OMP_WAIT_POLICY=PASSIVE` (threads that wait sleep at once)
  unless the environment already sets it. OpenMP reads it once, when torch loads, so it is set before any heavy
  import (`prefer_passive_wait`); a Python program that imports torch itself sets it in its own environment.

Imports torch only inside `threads`, so the command line can call `prefer_passive_wait` before torch loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

#: the OpenMP wait policy the command line asks for, unless the environment says otherwise
WAIT_POLICY = "PASSIVE"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; all CPUs where the platform has no such mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def prefer_passive_wait(environ: dict[str, str] | None = None) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE unless it is set already; True when it takes effect, i.e. torch has not loaded
    yet (OpenMP reads its environment once, when the library loads)."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules:
        return False
    environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    return environ["OMP_WAIT_POLICY"].upper() == WAIT_POLICY


@contextlib.contextmanager
def threads(count: int | None) -> Iterator[int]:
    """torch's intra-op threads set to `count` for the block (None: left as they are), the old count restored
    after it; yields the count in effect."""
    import torch

    before = torch.get_num_threads()
    if count is None:
        yield before
        return
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)
