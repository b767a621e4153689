"""The one loop every analysis runs: a source's batches through the probes into a run directory.

    source (model + corpus, or synthetic q, k, v) ─► batches ─► capture ─► probes ─► RunDir

An analysis is a `Job`: its kind, the settings that identify it, how to open its source and which
probe to build for it. `execute` does the rest, the same way for every analysis: checks the target
before touching the disk, resumes from a checkpoint, shards sequences across torch.distributed
processes and combines their states, checkpoints every `checkpoint_seconds`, reports progress, and
writes the probe's tables and arrays with run.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch

from . import distributed
from .config import Output
from .errors import SpectraError
from .probes import Probe
from .runs import RunDir
from .stats import plain

#: progress(done, total) after every batch; total is the requested number of sequences
Progress = Callable[[int, int], None]


class Source(Protocol):
    """What the loop reads from: see `spectra.sources`."""

    layers: int
    heads: int
    n: int
    device: torch.device

    def describe(self) -> dict[str, Any]: ...

    def batches(self, samples: int, batch_size: int, skip: int = 0, shard: tuple[int, int] = (0, 1)) -> Iterator[Any]: ...

    def run(self, batch: Any, observe: Callable[[Any], None]) -> None: ...


@dataclass(frozen=True)
class Job:
    """One analysis, ready to run.

    `settings` identify the run (recorded in run.json, compared on --resume); `open_source(device)`
    reads the data and loads the model; `build_probe(source)` and `meta(source)` may use what it found.
    """

    kind: str
    settings: dict[str, Any]
    samples: int
    batch_size: int
    device: Any
    default_out: Path
    open_source: Callable[[Any], Source]
    build_probe: Callable[[Source], Probe]
    meta: Callable[[Source], dict[str, Any]]


@dataclass(frozen=True)
class Reporter:
    """How a run talks while it runs: progress callback, one-line notices, checkpoint interval."""

    progress: Progress | None = None
    notify: Callable[[str], None] = print
    checkpoint_seconds: float = 60.0


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    found = {}
    for name in ("spectra-attention", "torch", "transformers", "datasets", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def execute(job: Job, output: Output, reporter: Reporter = Reporter()) -> Path:
    """Stream the job's sequences through its probe and write the run; returns the run directory.

    Nothing touches the disk until the first checkpoint, so bad input leaves no trace.
    """
    target = RunDir(output.out or job.default_out, overwrite=output.overwrite, resume=output.resume)
    notify, progress, checkpoint_seconds = reporter.notify, reporter.progress, reporter.checkpoint_seconds
    if target.complete:
        notify(f"{target.out} is already complete; loading it")
        return target.out
    previous = target.checkpoint_meta()
    if previous is not None and previous["settings"] != job.settings:
        changed = sorted(key for key, value in job.settings.items() if previous["settings"].get(key) != value)
        raise SpectraError(f"cannot resume {target.partial}: it was started with different {', '.join(changed)}")

    device = job.device
    if distributed.requested():
        if output.resume:
            raise SpectraError("--resume is not supported across processes; resume with a single process")
        from .models import pick_device

        device = distributed.start(pick_device(device))
        checkpoint_seconds = float("inf")  # the shares are combined only at the end
        notify = notify if distributed.is_main() else (lambda line: None)
        progress = progress if distributed.is_main() else None
    source = job.open_source(device)
    probe = job.build_probe(source)
    record: dict[str, Any] = {"kind": job.kind, "settings": job.settings, **source.describe(), **job.meta(source),
                              "versions": versions()}
    done, elapsed = 0, 0.0
    if previous is not None:
        state, done = target.load_checkpoint()
        probe.load_state(state)
        elapsed = float(previous.get("wall_seconds", 0.0))
        notify(f"resuming {target.partial} after {done} sequences")
    target.begin(record)
    start = last_save = time.perf_counter()
    if progress is not None:
        progress(done, job.samples)
    seen = 0
    try:
        for batch in source.batches(job.samples, job.batch_size, skip=done,
                                    shard=(distributed.rank(), distributed.size())):
            source.run(batch, probe.update)
            probe.after_batch(batch)
            seen += len(batch.index)
            if time.perf_counter() - last_save >= checkpoint_seconds:
                target.save_checkpoint(plain(probe.state()), done + seen,
                                       wall_seconds=elapsed + time.perf_counter() - start)
                last_save = time.perf_counter()
            if progress is not None:  # with several processes: this one's share, scaled
                progress(min(done + seen * distributed.size(), job.samples), job.samples)
        probe.load_state(distributed.reduce_state(probe.state(), source.device))
    finally:
        probe.close()
    processed = done + distributed.total(seen, source.device)
    if processed < job.samples:
        notify(f"the corpus yields {processed} sequences of the {job.samples} asked for; all of them were used")
    record.update(status="complete", samples=processed, wall_seconds=elapsed + time.perf_counter() - start,
                  processes=distributed.size(), **probe.describe())
    if distributed.is_main():
        target.finish(record, probe.tables(), probe.arrays())
    distributed.barrier()
    return target.out
