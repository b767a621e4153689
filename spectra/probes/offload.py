"""The spectrum stage beside the forward pass: on the device where it runs fastest, on a background thread.

Batched SVDs and eigensolvers of 512×512 matrices are not what GPUs do best (torch loops over the batch
for matrices larger than 32×32 on CUDA), while the forward pass is. `Offloaded` wraps a `SpectrumProbe`:
each layer's P and its valid keys go to the spectrum device — on CUDA through pinned memory, asynchronously —
and one worker thread runs the probe's updates in call order while the model computes the next layers.
One worker and FIFO order make the sums, and so the results, bitwise equal to running inline. Every path
(inline, worker, GPU, the CPU fallback) hands the probe the record's global sequence indices, which seed the
bootstrap weights; a record without them is a bug and raises (`Captured.sequence_index`).

`device="auto"` takes the batched cuSOLVER route (`spectra.batched`) on the model's GPU where it can run (CUDA,
a libcusolver with `cusolverDnXsyevBatched`, P larger than torch's batched 32 × 32), and overlaps it with the
forward on a worker thread and a stream of its own; elsewhere it times the singular values of the first layer's P
on the model's device and on the CPU and keeps the faster; on CPU and MPS models the spectra always run on the
CPU. `device="cuda"` asks for the batched route and is one SpectraError line where it cannot run.

The off-device path (pinned copies, events, the worker, GPU spectra) cannot be exercised without a GPU,
so any failure in it falls back, once and with one warning line, to computing the spectra inline on the
CPU from the layer's own tensors: the run goes on and its numbers are those of the CPU path. A failure of
the inline CPU computation itself is a real error and is raised.
"""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
import torch

from .. import cusolver
from ..batched import EXACT, LEVELS, batched_sigma, precision, route
from ..capture import Captured
from ..config import Place, choose
from ..errors import SpectraError
from ..spectrum import masked, singular_values
from ..stats import State
from ..timings import stage
from .base import Probe
from .spectrum import SpectrumProbe


def _to(x: torch.Tensor, device: torch.device, wait: bool) -> torch.Tensor:
    """x on `device`; from CUDA to the CPU through pinned memory, without blocking the stream unless `wait`."""
    if x.device == device:
        return x
    if x.device.type == "cuda" and device.type == "cpu" and not wait:
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        return host.copy_(x, non_blocking=True)
    return x.to(device)


def _seconds(p: torch.Tensor) -> float:
    """Wall time of the singular values of the batch p where it lies (the second of two calls)."""
    for _ in range(2):
        if p.device.type == "cuda":
            torch.cuda.synchronize(p.device)
        start = time.perf_counter()
        singular_values(p)
        if p.device.type == "cuda":
            torch.cuda.synchronize(p.device)
        elapsed = time.perf_counter() - start
    return elapsed


class Offloaded(Probe):
    """A SpectrumProbe run on `device` ("auto", "cpu", "same" as the model or "cuda": the batched route on its
    GPU), overlapped when `overlap`, the batched route within `tolerance` of c.

    overlap=None overlaps exactly when the spectra leave the model's device or take the batched route (a
    CPU-only machine gains nothing from running two stages that both use every core at once). The worker holds
    at most `depth` pending layers, so memory stays bounded when the spectra are the slower stage. `warn` prints
    the one line said when the off-device path fails and the spectra fall back to the CPU.
    """

    def __init__(self, probe: SpectrumProbe, device: Place | str = Place.AUTO, overlap: bool | None = None,
                 depth: int | None = None, warn: Callable[[str], None] | None = None,
                 tolerance: float = EXACT) -> None:
        self.probe, self.place, self.overlap = probe, choose(Place, device, "--spectrum-device"), overlap
        self.tolerance, self.route = tolerance, ""
        self._stream: Any = None  # the batched route's own CUDA stream, when it overlaps
        self.warn = warn or (lambda line: print(line, file=sys.stderr))
        self.device: torch.device | None = None  # decided at the first update
        self.seconds: dict[str, float] = {}
        self.fallback: str | None = None  # why the spectra fell back to the CPU, once they have
        self._levels: torch.Tensor | None = None  # the batched route's matrices by how they were solved
        self._pending: queue.Queue = queue.Queue(maxsize=depth or probe.layers)
        self._redo: collections.deque = collections.deque()  # layers the worker could not do, in order
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None
        self._reported = False

    def _decide(self, p: torch.Tensor, valid: torch.Tensor) -> None:
        source = p.device
        self.route = route(self.place, source, p.shape[-1], lambda: cusolver.available(source))
        if self.route == "cpu":
            self.device = torch.device("cpu")
        elif self.route == "same":
            self.device = source
        elif self.route == "batched":
            self.device = source
            self._levels = torch.zeros(len(LEVELS), dtype=torch.int64, device=source)
            self.probe.solve = partial(batched_sigma, tolerance=self.tolerance, levels=self._levels)
        else:
            sample = masked(p, valid)
            self.seconds = {source.type: _seconds(sample),
                            "cpu": _seconds(sample.cpu())}
            self.device = min((source, torch.device("cpu")), key=lambda d: self.seconds[d.type])
        if self.overlap is None:
            self.overlap = self.device != source or self.route == "batched"
        if self.overlap and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
        if self.overlap:
            self._worker = threading.Thread(target=self._work, name="spectra-spectrum", daemon=True)
            self._worker.start()

    @property
    def off_path(self) -> bool:
        """Whether the spectra use the off-device path (another device, or a worker thread)."""
        return not self.fallback and (bool(self.overlap) or self.device != torch.device("cpu"))

    def _fall_back(self, error: BaseException) -> None:
        """Switch to inline CPU spectra for the rest of the run, saying so once."""
        if self.fallback is None:
            self.fallback = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".strip()
            self.warn(f"warning: the spectra's {self.device} path failed ({self.fallback}); computing them inline "
                      "on the CPU from here on (same numbers, slower)")

    def _inline(self, layer: int, p: torch.Tensor, valid: torch.Tensor, index: list[int]) -> None:
        self.probe.add(layer, p.cpu(), valid.cpu(), index)

    def update(self, captured: Captured) -> None:
        layer, p, valid, index = captured.layer, captured.p, captured.valid, captured.sequence_index()
        if self.device is None:
            try:
                self._decide(p, valid)
            except SpectraError:  # --spectrum-device cuda where it cannot run: the user's to fix
                raise
            except Exception as error:  # noqa: BLE001 - timing or starting the worker failed: use the CPU
                self.device = torch.device("cpu")
                self._fall_back(error)
        self._catch_up()
        if not self.off_path:
            self._inline(layer, p, valid, index)
            return
        try:
            moved_p, moved_valid = _to(p, self.device, not self.overlap), _to(valid, self.device, not self.overlap)
            if not self.overlap:  # on the model's GPU, inline
                self.probe.add(layer, moved_p, moved_valid, index)
                return
            ready = None
            if p.device.type == "cuda":  # the worker waits for the copy (or P itself), not for the GPU's later work
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(p.device))
        except Exception as error:  # noqa: BLE001 - the off-device path failed: this layer and the rest on the CPU
            self._fall_back(error)
            self._catch_up()
            self._inline(layer, p, valid, index)
            return
        with stage("wait"):  # the queue holds at most `depth` layers: the forward waits for the spectra
            self._pending.put((layer, moved_p, moved_valid, index, ready, p, valid))

    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                item = self._pending.get()
                try:
                    if item is None:
                        return
                    layer, p, valid, index, ready, source_p, source_valid = item
                    if self.fallback is not None:
                        self._redo.append((layer, source_p, source_valid, index))
                        continue
                    try:
                        self._add(layer, p, valid, index, ready)
                    except BaseException as error:  # handed to the main thread, which redoes the layer on the CPU
                        self._error = self._error or error
                        self.fallback = self.fallback or "worker"
                        self._redo.append((layer, source_p, source_valid, index))
                finally:
                    self._pending.task_done()

    def _add(self, layer: int, p: torch.Tensor, valid: torch.Tensor, index: list[int], ready: Any) -> None:
        """The worker's update: on the CPU once the copy has landed; on the GPU on its own stream, which waits
        for P without the host waiting (P's memory is kept from reuse until the stream's work on it is done)."""
        if self._stream is None:
            if ready is not None:
                ready.synchronize()
            self.probe.add(layer, p, valid, index)
            return
        with torch.cuda.stream(self._stream):
            if ready is not None:
                self._stream.wait_event(ready)
            p.record_stream(self._stream)
            valid.record_stream(self._stream)
            self.probe.add(layer, p, valid, index)

    def _catch_up(self) -> None:
        """After a failure in the worker: wait for it, say so once, and redo its layers inline, in order."""
        if self.fallback is None or self._worker is None:
            return
        self._pending.join()
        if self._error is not None and not self._reported:
            self._reported, self.fallback = True, None
            self._fall_back(self._error)
        try:
            while self._redo:
                self._inline(*self._redo.popleft())
        except BaseException:  # the inline computation failed too: a real error, raised once
            self._redo.clear()
            raise

    def drain(self) -> None:
        """Wait until every queued update is in the probe's sums."""
        if self._worker is not None:
            with stage("wait"):
                self._pending.join()
        self._catch_up()

    def close(self) -> None:
        """Drain and stop the worker thread."""
        if self._worker is not None:
            try:
                self._pending.join()
                self._catch_up()
            finally:
                self._pending.put(None)
                self._worker.join()
                self._worker = None

    def describe(self) -> dict[str, Any]:
        """Where the spectra ran, whether they overlapped the forward, the timings that chose it, any fallback."""
        batched = self.route == "batched" and not self.fallback
        if batched and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the worker's stream may still be adding to the counts
        route = {"spectrum_route": f"batched cuSOLVER, {str(precision(self.tolerance)).split('.')[-1]} first",
                 "spectrum_tolerance": self.tolerance,
                 "spectrum_levels": dict(zip(LEVELS, self._levels.tolist()))} if batched else {}
        return {"spectrum_device": "cpu" if self.fallback else str(self.device), "overlap": bool(self.overlap), **route,
                **({"spectrum_seconds": self.seconds} if self.seconds else {}),
                **({"spectrum_fallback": self.fallback} if self.fallback else {})}

    def state(self) -> State:
        self.drain()
        return self.probe.state()

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.drain()
        self.probe.load_state(arrays)

    def tables(self) -> dict[str, Any]:
        self.drain()
        return self.probe.tables()

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        self.drain()
        return self.probe.arrays()
