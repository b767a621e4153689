"""Where a run's wall time goes: seconds per stage, recorded in run.json and printed at the end of a run.

The loop opens a `Timings` for the run (`recording`); the code that does the work marks its stages with
`stage(name)`, which costs nothing when no run is recording. Stages nest: time spent in an inner stage
(the spectra, inside a probe, inside the forward pass that captured the layer) is not counted again in
the outer one, so on the thread that runs the loop the stages add up to the time the loop ran. A stage
marked on another thread (the spectra's worker with --overlap) runs beside the loop's own stages; the
time the loop spent blocked on it is the stage "wait".

Imports neither torch nor numpy, so the printers (`spectra.report.console`) read it at no cost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: the stages, in the order a run meets them
STAGES = {
    "load": "reading the data, loading the model and tokenizer, checking they fit",
    "tokenize": "turning documents into token blocks",
    "forward": "the model's forward pass, forming P (the capture) included",
    "spectra": "the singular values of P",
    "probes": "everything else the probes do: curves, summaries, row metrics, other probes",
    "wait": "the loop blocked on the spectra's worker thread (--overlap)",
    "write": "checkpoints and the run directory",
}
#: stages that grow with the number of sequences (the others are paid once per run)
PER_SEQUENCE = ("tokenize", "forward", "spectra", "probes", "wait")

_active: Timings | None = None
_clock = time.perf_counter


class Timings:
    """Seconds per stage, added up across threads; each thread keeps its own stack of open stages so that
    an inner stage's time is taken out of the outer one (exclusive times)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._local = threading.local()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Count the block's time to `name`, less the time of stages opened inside it on the same thread."""
        stack: list[list[Any]] = self._local.__dict__.setdefault("stack", [])
        now = _clock()
        if stack:  # pause the outer stage
            outer = stack[-1]
            self.add(outer[0], now - outer[1])
        stack.append([name, now])
        try:
            yield
        finally:
            now = _clock()
            name, since = stack.pop()
            self.add(name, now - since)
            if stack:
                stack[-1][1] = now  # resume the outer stage

    def seconds(self) -> dict[str, float]:
        """Seconds per stage so far, stages still open on this thread included up to now."""
        with self._lock:
            found = dict(self._seconds)
        now = _clock()
        for name, since in self._local.__dict__.get("stack", []):
            found[name] = found.get(name, 0.0) + now - since
        return found

    def report(self, sequences: int) -> dict[str, Any]:
        """What run.json records: seconds per stage (in STAGES order), the sequences this process ran in this
        session, and seconds per sequence of the stages that grow with them."""
        found = self.seconds()
        ordered = {name: round(found[name], 4) for name in [*STAGES, *sorted(set(found) - set(STAGES))]
                   if name in found}
        per = {name: round(found[name] / sequences, 5) for name in PER_SEQUENCE if name in found and sequences}
        return {"seconds": ordered, "sequences": sequences, "per_sequence": per}


@contextlib.contextmanager
def recording() -> Iterator[Timings]:
    """Record the stages marked anywhere in the process (on any thread) during the block into a new Timings."""
    global _active
    timings, previous = Timings(), _active
    _active = timings
    try:
        yield timings
    finally:
        _active = previous


def stage(name: str) -> contextlib.AbstractContextManager:
    """Count the block's time to stage `name` of the run being recorded (nothing when none is)."""
    timings = _active
    return timings.stage(name) if timings is not None else contextlib.nullcontext()


def timed(name: str, items: Iterable[T]) -> Iterator[T]:
    """The items of an iterable, the time spent producing each counted to stage `name`."""
    iterator = iter(items)
    while True:
        with stage(name):
            item = next(iterator, _END)
        if item is _END:
            return
        yield item  # type: ignore[misc]


_END = object()


def summary(record: dict[str, Any] | None) -> str:
    """One line for the end of a run: total, then per sequence, then the one-off stages; '' without a record."""
    if not record or not record.get("seconds"):
        return ""
    seconds, per, sequences = record["seconds"], record.get("per_sequence", {}), record.get("sequences", 0)
    shown = [name for name in PER_SEQUENCE if per.get(name, 0) >= 0.0005]
    each = sum(per.get(name, 0.0) for name in PER_SEQUENCE)
    parts = [f"time {sum(seconds.values()):.1f} s"]
    if sequences:
        parts.append(f"{each:.3g} s per sequence ({', '.join(f'{name} {per[name]:.2g}' for name in shown)})")
    once = [f"{name} {seconds[name]:.1f} s" for name in seconds if name not in PER_SEQUENCE and seconds[name] >= 0.05]
    return "; ".join(parts + once)
