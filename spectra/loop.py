"""The one loop every analysis runs: a source's batches through the probes into a run directory.

    source (model + corpus, or synthetic q, k, v) ─► batches ─► capture ─► probes ─► RunDir

An analysis is a `Job`: its kind, its run configuration and the settings that identify it, how to open its
source and which probe to build for it. `execute` does the rest, the same way for every analysis: checks the
target before touching the disk and locks it before the model loads, resumes from a checkpoint, shares sequences
across torch.distributed processes and combines their states, checkpoints every `config.checkpoint_seconds` (one
process: its checkpoint.npz; several, or one resuming theirs: each its own shard, `spectra.shards`; a resume skips
every sequence a checkpoint holds and combines their states at the end), reports progress through the run's
`Reporter`, and writes the probe's tables and arrays with run.json.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from . import distributed, runtime, shards, timings
from .config import RunConfig
from .errors import Interrupted, SpectraError, spell
from .probes import Probe
from .reporter import Reporter, plural
from .rundir import OVERWRITE, RESUME, RunDir, default_dir, versions
from .stats import plain

if TYPE_CHECKING:
    from .capture import Captured
    from .kv.presses import Prefill

#: settings that change how fast a run goes, not what it computes: a run may resume with others
NOT_IDENTITY = ("batch_size",)
#: content keys of run.json's data record that a resumed run must find unchanged
DATA_IDENTITY = ("bytes", "sha256", "fingerprint", "documents")

class Source(Protocol):
    """What the loop reads from: see `spectra.sources`."""

    layers: int
    heads: int
    n: int
    device: torch.device

    def data(self) -> dict[str, Any]: ...

    def start(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def batches(self, sequences: int, skip: int = 0, shard: tuple[int, int] = (0, 1),
                held: Container[int] = ()) -> Iterator[Any]:
        """Batches of the first `sequences` (each source batches as its run configuration says), from `skip` on,
        leaving out those `held` (by checkpoints), keeping the shard's share (`distributed.share`)."""

    def run(self, batch: Any, probe: Probe) -> None:
        """The batch's pass, each layer handed to the probe's input for that pass (`Probe.update` for a forward
        pass, `Probe.prefilled` for an exact prefill)."""


class Staged(Probe):
    """What a source hands the probe, each layer's time counted to the stage 'probes' (the rest of the pass is
    'forward')."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def update(self, captured: Captured) -> None:
        with timings.stage("probes"):
            self.probe.update(captured)

    def prefilled(self, prefill: Prefill) -> None:
        with timings.stage("probes"):
            self.probe.prefilled(prefill)


@dataclass(frozen=True)
class Job:
    """One analysis, ready to run.

    `config` says what to read and where to write; `settings` identify the run (recorded in run.json, compared on
    --resume); `samples` is how many sequences are evaluated, after `calibration` sequences that fit what
    calibrates (they stream through first; `sequences` counts both); `open_source(device)` reads the data and loads the model; `build_probe(source)` and `meta(source)` may use
    what it found.
    """

    kind: str
    config: RunConfig
    settings: dict[str, Any]
    samples: int
    default_out: Path
    #: what owns the default run directory name (the resolved model source), so two models never share it
    owner: str
    open_source: Callable[[Any], Source]
    build_probe: Callable[[Source], Probe]
    meta: Callable[[Source], dict[str, Any]]
    #: bytes one sequence needs while its batch runs (attention matrices and the probe's work), for the memory check
    bytes_per_sequence: Callable[[Source], float] = lambda source: 8.0 * 6 * source.heads * source.n ** 2
    #: settings left at a default that follows from others (--at's n/4 follows --length): a refused --resume names
    #: them only when nothing else differs, so it never lists an option the user did not type
    derived: tuple[str, ...] = ()
    #: the analysis's identity options at their declared defaults: what a run recorded before an option existed ran
    #: with (`options.defaults`), so adding an option never refuses resuming an older run
    defaults: dict[str, Any] = field(default_factory=dict)
    #: sequences read first to calibrate (fitted methods, calibrated presses), not evaluated
    calibration: int = 0

    @property
    def sequences(self) -> int:
        """Every sequence that streams through: the calibration ones, then the evaluated ones."""
        return self.calibration + self.samples


def _differences(recorded: dict[str, Any], wanted: dict[str, Any], derived: tuple[str, ...] = (),
                 defaults: dict[str, Any] | None = None) -> list[str]:
    """The identity settings that differ between a recorded run and the one asked for (the analysis's own
    options, under "extra", named one by one); a `derived` one only when no other differs (it followed them). An
    option the recorded run lacks (it predates the option) is compared as its declared default (`defaults`)."""
    def flat(settings: dict[str, Any]) -> dict[str, Any]:
        return {**{key: value for key, value in settings.items() if key != "extra"}, **settings.get("extra", {})}

    recorded, wanted = flat(recorded), flat(wanted)
    recorded = {**{key: value for key, value in (defaults or {}).items() if key in wanted}, **recorded}
    keys = (set(recorded) | set(wanted)) - set(NOT_IDENTITY)
    changed = sorted(key for key in keys if recorded.get(key) != wanted.get(key))
    return [key for key in changed if key not in derived] or changed


def _data_changes(recorded: dict[str, Any], source: Source) -> list[str]:
    """The content keys (`DATA_IDENTITY`) of a run's recorded data that the data read now does not match."""
    before, now = recorded.get("data", {}), source.data()
    return [key for key in DATA_IDENTITY if key in before and before[key] != now.get(key)]


def differ(changed: list[str]) -> str:
    """The data's changed keys in a sentence: "its sha256 differs", "its bytes and sha256 differ"."""
    names = changed[0] if len(changed) == 1 else f"{', '.join(changed[:-1])} and {changed[-1]}"
    return f"its {names} {'differs' if len(changed) == 1 else 'differ'}"


@contextlib.contextmanager
def _deferred_interrupts(notify: Callable[[str], None]) -> Iterator[Callable[[], bool]]:
    """While the batches run, Ctrl-C (SIGINT) or SIGTERM only raises a flag the loop checks between batches, so
    the checkpoint it writes is whole (and says so at once); a second signal stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    hits: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if hits:
            raise KeyboardInterrupt
        hits.append(signum)
        notify("stopping after this batch, with a checkpoint (interrupt again to stop at once)")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(hits)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _free_bytes(device: torch.device) -> float | None:
    """Memory available for new allocations on `device` (None when unknown)."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _check_memory(job: Job, source: Source) -> None:
    """Refuse a batch size whose attention matrices would not fit in the free memory, suggesting one that does."""
    free = _free_bytes(source.device)
    per_sequence, batch_size = job.bytes_per_sequence(source), job.config.batch_size
    if free is None or batch_size * per_sequence <= 0.8 * free:
        return
    fits = max(1, int(0.8 * free // per_sequence))
    raise SpectraError(
        f"{spell(f'--batch-size {batch_size}', f'batch_size={batch_size}')} needs about "
        f"{batch_size * per_sequence / 2**30:.1f} GiB for one batch's attention at n = {source.n} ({source.heads} "
        f"heads), but about {free / 2**30:.1f} GiB is free on {source.device.type}; use "
        f"{spell(f'--batch-size {fits}', f'batch_size={fits}')} or less"
    )


def _out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))


def _stream(job: Job, source: Source, probe: Probe, target: RunDir, held: shards.Held,
            writer: shards.Writer | None, reporter: Reporter, wall: Callable[[], float]) -> int:
    """Run this process's batches, leaving out those checkpoints hold, through the probe and combine the processes'
    states (and the `held` ones, with shards); returns the sequences this process saw. Checkpoints on time and on
    an interrupt: into checkpoint.npz, or with a `writer` into this process's shard (no collective)."""
    seen, last_save, size, done = 0, time.perf_counter(), distributed.size(), len(held)
    saved = [done] if done else []  # sequences checkpointed, as far as this process knows
    about = "about " if size > 1 else ""

    def checkpoint() -> bool:
        if not probe.ready():  # e.g. in the middle of a calibration: the next batch will do
            return False
        with timings.stage("write"):
            if writer is None:
                target.save_checkpoint(plain(probe.state()), done + seen, wall_seconds=wall())
            else:
                target.save_progress(distributed.is_main(), wall_seconds=wall())
                writer.save(plain(probe.state()))
        saved[:] = [done + seen * size]
        return True

    reporter.advance(done, job.sequences)
    try:
        with _deferred_interrupts(reporter.notify) as interrupted:
            for batch in timings.timed("tokenize", source.batches(job.sequences, skip=held.prefix, held=held,
                                                                   shard=(distributed.rank(), size))):
                with timings.stage("forward"):
                    source.run(batch, Staged(probe))
                with timings.stage("probes"):
                    probe.after_batch(batch)
                seen += len(batch.index)
                if writer is not None:
                    writer.add(batch.index)
                if interrupted():
                    if not checkpoint() and not saved:
                        raise Interrupted(f"interrupted after {plural(done + seen, 'sequence')}, during the calibration: "
                                          "nothing was saved; run the command again")
                    shared = (f" (each process's sequences are checkpointed in {target.partial}; resume with one "
                              "process or several)" if writer is not None else "")
                    raise Interrupted(f"interrupted after {about}{plural(done + seen * size, 'sequence')}; continue with "
                                      f"{RESUME} and the same {spell('--out')} ({target.out}){shared}")
                if time.perf_counter() - last_save >= job.config.checkpoint_seconds and probe.ready():
                    checkpoint()
                    last_save = time.perf_counter()
                # with several processes: this one's share, scaled
                reporter.advance(min(done + seen * size, job.sequences), job.sequences)
        if writer is not None and writer.pending:  # before waiting for the others: a crash of one loses nothing here
            checkpoint()
        live = probe.state()
        combined = distributed.reduce_state(live, source.device)
        if writer is not None and held and distributed.is_main():  # the checkpoints' states join the processes'
            combined = shards.combine(live, combined, held.states(target.partial), target.partial)
        probe.load_state(combined)
    except KeyboardInterrupt:
        if not saved:  # nothing on disk to continue from
            raise Interrupted(f"interrupted twice: stopped at once after {plural(done + seen, 'sequence')}, before the first "
                              "checkpoint: nothing was saved; run the command again") from None
        raise Interrupted(f"interrupted twice: stopped at once; continue from the checkpoint after {about}"
                          f"{plural(saved[0], 'sequence')} with {RESUME} and the same {spell('--out')} ({target.out})") from None
    except (RuntimeError, MemoryError) as error:
        if not (isinstance(error, MemoryError) or _out_of_memory(error)):
            raise
        kept = (f"the checkpoint after {about}{plural(saved[0], 'sequence')} is kept: continue with {RESUME} and"
                if saved else "nothing was written: try again with")
        raise SpectraError(f"ran out of memory after {plural(done + seen, 'sequence')}; {kept} a smaller "
                           f"{spell('--batch-size')}") from None
    return seen


def execute(job: Job, reporter: Reporter = Reporter()) -> Path:
    """Stream the job's sequences through its probe and write the run; returns the run directory.

    Nothing touches the disk until the first checkpoint, so bad input leaves no trace. An interrupt
    (Ctrl-C, SIGTERM) is honoured between batches: the state so far is checkpointed and `Interrupted`
    says how to continue. The stage timings (`spectra.timings`) go into run.json under "timings". torch runs on
    `config.threads` intra-op threads for the job (None: as many as it has), the count before restored after.
    """
    with timings.recording() as timer, runtime.threads(job.config.threads):
        return _execute(job, reporter, timer)


def _execute(job: Job, reporter: Reporter, timer: timings.Timings) -> Path:
    """The run, under the run directory's lock from the first look at the target to the last file written: the
    target is checked again once the lock is held (`RunDir.claimed`), and the model loads only after that, so a
    second run aimed at the same place is refused at once, whenever it starts, instead of loading a model and
    replacing the first run's results when that one has finished (issue 41, defect 3)."""
    config = job.config
    target = RunDir(config.out or default_dir(job.default_out, job.owner), overwrite=config.overwrite,
                    resume=config.resume, lock=distributed.is_main())
    with target.claimed():
        return _claimed(job, target, reporter, timer)


def _claimed(job: Job, target: RunDir, reporter: Reporter, timer: timings.Timings) -> Path:
    config = job.config
    notify = reporter.notify
    if target.complete:
        finished = target.finished_meta()
        changed = _differences(finished["settings"], job.settings, job.derived, job.defaults)
        if changed:
            raise SpectraError(f"{target.out} is a complete run with different {', '.join(changed)}; pass {OVERWRITE} "
                               f"to replace it, or choose another {spell('--out')}")
        changed = _data_changes(finished, job.open_source(config.device))
        if changed:
            raise SpectraError(f"{target.out} is a complete run of other data: {differ(changed)} from "
                               f"what the data holds now; pass {OVERWRITE} to replace it, or choose another "
                               f"{spell('--out')}")
        notify(f"{target.out} is already complete; loading it")
        return target.out
    previous = target.checkpoint_meta()
    found: tuple[shards.Shard, ...] = ()
    if previous is not None:
        changed = _differences(previous["settings"], job.settings, job.derived, job.defaults)
        if changed:
            raise SpectraError(f"cannot resume {target.partial}: it was started with different {', '.join(changed)}; "
                               f"pass {OVERWRITE} to start over, or choose another {spell('--out')}")
        found = shards.read(target.partial, job.kind, lambda recorded: _differences(recorded, job.settings, job.derived,
                                                                                  job.defaults))
    sharded = distributed.requested() or bool(found)  # each process checkpoints into its own shard

    device = config.device
    if distributed.requested():
        if previous is not None and job.calibration:
            raise SpectraError(f"cannot resume {target.partial} across processes: its calibrated methods or presses "
                               "were fitted in one process, which the others would lack; resume it with a single "
                               "process")
        from .models import pick_device

        device = distributed.start(pick_device(device))
        reporter = reporter if distributed.is_main() else reporter.quiet()
        notify = reporter.notify
    if previous is None and config.resume:
        notify(f"nothing to resume in {target.out}; starting a new run")
    with timings.stage("load"):
        source = job.open_source(device)
    for recorded, what in ((previous, ""), *((shard.meta, f" ({shard.path.name})") for shard in found)):
        changed = [] if recorded is None else _data_changes(recorded, source)
        if changed:
            raise SpectraError(f"cannot resume {target.partial}{what}: the data changed since it started "
                               f"({differ(changed)}); pass {OVERWRITE} to start over")
    with timings.stage("load"):
        source.start()
        _check_memory(job, source)
        probe = job.build_probe(source)
    record: dict[str, Any] = {"kind": job.kind, "settings": job.settings, **source.describe(),
                              **job.meta(source), "versions": versions()}
    done, elapsed = 0, 0.0
    if previous is not None:  # with shards, the held states join the processes' at the end; every one skips them
        state, done = target.load_checkpoint()
        if not sharded:
            probe.load_state(state)
        elapsed = float(previous.get("wall_seconds", 0.0))
    held = shards.Held(done, found)
    if previous is not None:
        notify(f"resuming {target.partial} after {plural(len(held), 'sequence')}")
    target.begin(record)
    writer = None
    if sharded:  # the first clears a directory it replaces, and every process has read the shards, before any writes
        target.clear(distributed.is_main())
        distributed.barrier()
        writer = shards.Writer(target.partial, {key: record.get(key) for key in ("kind", "settings", "data")},
                               distributed.rank(), distributed.size())
    started = time.perf_counter()
    try:
        seen = _stream(job, source, probe, target, held, writer, reporter, lambda: elapsed + time.perf_counter() - started)
    finally:
        with timings.stage("wait"):
            probe.close()
    processed = len(held) + distributed.total(seen, source.device)
    if processed < job.sequences:
        reporter.advance(processed, processed)
        notify(f"the corpus yields {plural(processed, 'sequence')} of the {job.sequences} "
               "asked for; all of them were used")
    if job.calibration:  # `samples` counts the evaluated sequences, as --samples does
        record.update(evaluation=[job.calibration, job.sequences], sequences=processed)
    record.update(status="complete", samples=max(0, processed - job.calibration), wall_seconds=elapsed + time.perf_counter() - started,
                  processes=distributed.size(), **probe.describe())
    if distributed.is_main():
        with timings.stage("write"):
            target.finish(record, probe.tables(), probe.arrays(), late=lambda: {"timings": timer.report(seen)})
    distributed.barrier()
    return target.out
