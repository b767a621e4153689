"""The spectrum stage on a background thread and on a chosen device: same numbers as inline, bounded queue,
errors surfaced, and what was chosen recorded in the run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from references import eager_ranks, poisson_replicates

import spectra
from spectra.capture import Captured
from spectra.config import Place
from spectra.errors import SpectraError
from spectra.probes.offload import Offloaded
from spectra.probes.spectrum import SpectrumProbe
from spectra.stats import Reduce, plain

pytestmark = pytest.mark.threads  # the worker thread and split_threads' pool, with the machine's cores

QUIET = dict(progress=None, notify=lambda line: None)


def _softmax_batches(count: int, n: int = 24, heads: int = 3, layers: int = 2, seed: int = 0):
    """Captured layers whose P are softmax matrices with padded keys, as the capture attention hands them over.

    q = logits, k = I and scale 1 make P = softmax(logits + mask)."""
    generator = torch.Generator().manual_seed(seed)
    eye = torch.eye(n).expand(2, heads, n, n)
    for i in range(count):
        lengths = torch.tensor([n, n - 5 - i % 3])
        valid = torch.arange(n)[None, :] < lengths[:, None]
        mask = torch.where(valid[:, None, None, :], 0.0, torch.finfo(torch.float32).min)
        for layer in range(layers):
            logits = torch.randn(2, heads, n, n, generator=generator) * (1 + layer)
            yield Captured.of(layer, logits, eye, torch.zeros_like(logits), mask, scaling=1.0, index=(2 * i, 2 * i + 1))


def _fed(probe, batches) -> dict[str, np.ndarray]:
    for captured in batches:
        probe.update(captured)
    return plain(probe.state())


@pytest.mark.parametrize("place", ["auto", "cpu", "same", Place.SAME])
def test_overlapped_equals_inline_bitwise(place) -> None:
    inline = _fed(SpectrumProbe(2, 3, 24, 6), _softmax_batches(6))
    offloaded = Offloaded(SpectrumProbe(2, 3, 24, 6), place, overlap=True, depth=2)
    overlapped = _fed(offloaded, _softmax_batches(6))
    offloaded.close()
    assert inline.keys() == overlapped.keys()
    for name in inline:
        assert np.array_equal(inline[name], overlapped[name]), name
    assert offloaded.describe() == {"spectrum_device": "cpu", "overlap": True}


def test_offloaded_hands_over_the_probes_results() -> None:
    inline = SpectrumProbe(2, 3, 24, 6)
    _fed(inline, _softmax_batches(2))
    offloaded = Offloaded(SpectrumProbe(2, 3, 24, 6), overlap=True)
    _fed(offloaded, _softmax_batches(2))
    assert offloaded.tables()["metrics.csv"].equals(inline.tables()["metrics.csv"])  # drained before reading
    for name, array in inline.arrays()["curves.npz"].items():
        assert np.array_equal(offloaded.arrays()["curves.npz"][name], array), name
    assert all(part.reduce is Reduce.SUM for part in offloaded.state().values())
    offloaded.close()


def test_cpu_model_defaults_to_inline() -> None:
    offloaded = Offloaded(SpectrumProbe(2, 3, 24, 6))
    _fed(offloaded, _softmax_batches(1))
    assert offloaded.describe() == {"spectrum_device": "cpu", "overlap": False}
    assert offloaded._worker is None  # nothing runs beside the forward on a CPU-only machine


def test_state_waits_for_the_queue_and_resumes() -> None:
    """state() drains the worker; a checkpointed state loaded into a fresh probe continues identically."""
    whole = _fed(SpectrumProbe(2, 3, 24, 6), _softmax_batches(4))
    first = Offloaded(SpectrumProbe(2, 3, 24, 6), overlap=True, depth=1)
    saved = _fed(first, list(_softmax_batches(4))[:4])
    first.close()
    second = Offloaded(SpectrumProbe(2, 3, 24, 6), overlap=True)
    second.load_state(saved)
    rest = _fed(second, list(_softmax_batches(4))[4:])
    second.close()
    for name in whole:
        assert np.array_equal(whole[name], rest[name]), name


def test_worker_error_reaches_the_caller() -> None:
    """A failure on the worker thread is raised in the main thread, and the worker does not hang."""
    offloaded = Offloaded(SpectrumProbe(2, 4, 24, 6), overlap=True, depth=4)  # 4 heads expected, 3 given
    with pytest.raises(ValueError, match="expected P of 4 heads"):
        _fed(offloaded, _softmax_batches(3))  # raised at a later update, or at the latest by state()
    offloaded.close()  # the layers queued after the failure are skipped, and the error is not raised twice
    assert offloaded._worker is None


def test_a_failing_copy_path_falls_back_once_to_inline_cpu(monkeypatch) -> None:
    """The pinned-copy path cannot run here (no GPU), so its failure is injected: the run goes on, inline on the
    CPU, with one warning line, and its numbers are those of the inline path."""
    from spectra.probes import offload

    inline = _fed(SpectrumProbe(2, 3, 24, 6), _softmax_batches(4))
    calls = {"n": 0}

    def broken(x, device, wait):
        calls["n"] += 1
        if calls["n"] == 5:  # the third layer's copy
            raise RuntimeError("CUDA error: pinned memory allocation failed")
        return x

    monkeypatch.setattr(offload, "_to", broken)
    lines: list[str] = []
    probe = Offloaded(SpectrumProbe(2, 3, 24, 6), overlap=True, depth=2, warn=lines.append)
    got = _fed(probe, _softmax_batches(4))
    probe.close()
    assert len(lines) == 1 and "pinned memory allocation failed" in lines[0] and "inline on the CPU" in lines[0]
    for name in inline:
        assert np.array_equal(inline[name], got[name]), name
    assert probe.describe()["spectrum_device"] == "cpu" and "pinned memory" in probe.describe()["spectrum_fallback"]


def test_a_failing_worker_hands_its_layers_back(monkeypatch) -> None:
    """A failure that only the worker thread meets (an event, a device kernel) is redone inline, in order."""
    import threading

    inline = _fed(SpectrumProbe(2, 3, 24, 6), _softmax_batches(5))
    real = SpectrumProbe.add

    def add(self, layer, p, valid, index):
        if threading.current_thread().name == "spectra-spectrum" and layer == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(self, layer, p, valid, index)

    monkeypatch.setattr(SpectrumProbe, "add", add)
    lines: list[str] = []
    probe = Offloaded(SpectrumProbe(2, 3, 24, 6), overlap=True, depth=3, warn=lines.append)
    got = _fed(probe, _softmax_batches(5))
    probe.close()
    assert len(lines) == 1 and "illegal memory access" in lines[0]
    for name in inline:
        assert np.array_equal(inline[name], got[name]), name
    assert probe._worker is None


def test_unknown_place() -> None:
    with pytest.raises(SpectraError, match="spectrum_device 'gpu'; use one of auto, cpu, same"):
        Offloaded(SpectrumProbe(2, 3, 24, 6), "gpu")


def test_run_with_overlap_equals_run_without(roberta_dir, text_file, tmp_path) -> None:
    """A whole analyze run: forward and spectra side by side give the same files as one after the other, bootstrap
    replicates included, and those are weighted by each sequence's global index on the worker thread too."""
    runs = {
        overlap: spectra.analyze(str(roberta_dir), str(text_file), length=32, samples=10, batch_size=4, bootstrap=30,
                                 overlap=overlap, out=tmp_path / f"run-{overlap}", **QUIET)
        for overlap in (False, True)
    }
    assert np.array_equal(runs[False].cum_mean, runs[True].cum_mean)
    assert np.array_equal(runs[False].cum_std, runs[True].cum_std)
    assert runs[False].metrics.equals(runs[True].metrics)
    replicates = {overlap: np.load(run.path / "bootstrap.npz", allow_pickle=False)["replicates"]
                  for overlap, run in runs.items()}
    assert np.array_equal(replicates[False], replicates[True])
    want = poisson_replicates(eager_ranks(roberta_dir, text_file, 32, 10), 30)  # independent: eager + scipy
    assert np.allclose(replicates[True], want, rtol=1e-12, atol=0)
    for overlap, run in runs.items():
        meta = json.loads((run.path / "run.json").read_text())
        assert meta["spectrum_device"] == "cpu" and meta["overlap"] is overlap


def _on(device: str, batches):
    """The same captured layers with every tensor on `device` (P is then computed there)."""
    for c in batches:
        yield Captured.of(c.layer, c.q.to(device), c.key.to(device), c.value.to(device), c.mask.to(device),
                          scaling=c.scaling, index=c.index)


@pytest.mark.cuda
@pytest.mark.parametrize("place, overlap", [("cpu", True), ("cpu", False), ("same", True), ("same", False),
                                            ("auto", None), ("cuda", None), ("cuda", False)])
def test_on_cuda_every_path_gives_the_cpus_numbers(place, overlap) -> None:
    """P computed on the GPU, its spectra on the CPU through pinned copies and the worker's events, or on the GPU
    itself, inline or overlapped: the numbers are the CPU's to within the rounding of P (float32 softmax on either
    device), and the path taken is the one recorded."""
    inline = _fed(SpectrumProbe(2, 3, 24, 6), _softmax_batches(6))
    lines: list[str] = []
    offloaded = Offloaded(SpectrumProbe(2, 3, 24, 6), place, overlap=overlap, depth=2, warn=lines.append)
    got = _fed(offloaded, _on("cuda", _softmax_batches(6)))
    described = offloaded.describe()
    offloaded.close()
    assert lines == [], "the GPU path fell back to the CPU"
    for name in inline:
        assert np.allclose(got[name], inline[name], rtol=1e-5, atol=1e-6), name
    device = "cpu" if place == "cpu" else "cuda:0"
    if place == "auto":  # the first layer timed on both devices, the faster kept
        seconds = described["spectrum_seconds"]
        assert set(seconds) == {"cpu", "cuda"} and seconds["cpu"] > 0 and seconds["cuda"] > 0
        device = "cpu" if seconds["cpu"] <= seconds["cuda"] else "cuda:0"
    assert described["spectrum_device"] == device
    assert described["overlap"] == ((device == "cpu" or place == "cuda") if overlap is None else overlap)
    assert ("spectrum_route" in described) == (place == "cuda")


def test_pinned_memory_is_asked_for_only_for_copies_from_a_gpu(monkeypatch) -> None:
    """Pinned host memory exists only with CUDA: a CPU model's spectra, inline or overlapped, never ask for it (the
    GPU path's pinned copies run in the `cuda` tests)."""
    from spectra.probes import offload

    asked: list[bool] = []
    empty = torch.empty

    def recording(*args, **kwargs):
        asked.append(bool(kwargs.get("pin_memory")))
        return empty(*args, **kwargs)

    monkeypatch.setattr(offload.torch, "empty", recording)
    for overlap in (False, True):
        probe = Offloaded(SpectrumProbe(2, 3, 24, 6), "cpu", overlap=overlap)
        _fed(probe, _softmax_batches(2))
        probe.close()
    assert not any(asked)
    x = torch.ones(3)
    assert offload._to(x, torch.device("cpu"), wait=False) is x  # already there: no copy at all


def test_the_batched_route_asked_for_without_a_gpu_is_an_error_not_a_fallback() -> None:
    lines: list[str] = []
    offloaded = Offloaded(SpectrumProbe(2, 3, 24, 6), "cuda", warn=lines.append)
    with pytest.raises(SpectraError, match="the model is on cpu"):
        _fed(offloaded, _softmax_batches(1))
    assert lines == []


@pytest.mark.parametrize("overlap", [None, False])
def test_the_batched_route_is_wired_to_the_probe(monkeypatch, overlap) -> None:
    """Where `route` says batched: the probe's solver becomes the batched route at the declared tolerance (off a
    GPU it is the exact CPU route, so the numbers are the inline ones bitwise), overlapped by default, and run.json
    says which route and tolerance."""
    from spectra.batched import LEVELS, batched_sigma
    from spectra.probes import offload

    monkeypatch.setattr(offload, "route", lambda place, source, width, missing: "batched")
    inline = _fed(SpectrumProbe(2, 3, 24, 6), _softmax_batches(3))
    offloaded = Offloaded(SpectrumProbe(2, 3, 24, 6), "auto", overlap=overlap, tolerance=1e-4)
    got = _fed(offloaded, _softmax_batches(3))
    described = offloaded.describe()
    offloaded.close()
    solve = offloaded.probe.solve
    assert solve.func is batched_sigma and solve.keywords == {"tolerance": 1e-4, "levels": offloaded._levels}
    for name in inline:
        assert np.array_equal(inline[name], got[name]), name
    none = dict.fromkeys(LEVELS, 0)  # off a GPU the exact CPU route solves them, and the route counts nothing
    assert described == {"spectrum_device": "cpu", "overlap": overlap is None, "spectrum_levels": none,
                         "spectrum_route": "batched cuSOLVER, float32 first", "spectrum_tolerance": 1e-4}


@pytest.mark.cuda
@pytest.mark.parametrize("place", ["cpu", "cuda"])
def test_on_cuda_handing_p_to_the_spectra_never_waits_for_the_gpu(place, monkeypatch) -> None:
    """The hot loop's handover (`Offloaded.update` on the main thread, overlapped): no host-device synchronisation
    (torch.cuda.set_sync_debug_mode reports every one); the worker thread's waits are its own. Prints how many the
    main thread made over the whole pass (capture included), for the GPU notes."""
    import threading
    import warnings

    from spectra.probes import offload

    batches = list(_on("cuda", _softmax_batches(4, n=64)))
    offloaded = Offloaded(SpectrumProbe(2, 3, 64, 16), place, overlap=True, depth=8)
    offloaded.update(batches[0])  # the first layer decides the route (auto's timing may wait): not the hot loop
    inside, syncs = threading.local(), []
    update = offload.Offloaded.update

    def watched(self, captured) -> None:
        inside.on = True
        try:
            update(self, captured)
        finally:
            inside.on = False

    def record(message, *args, **kwargs) -> None:
        if threading.current_thread() is threading.main_thread():
            syncs.append((getattr(inside, "on", False), str(message)))

    monkeypatch.setattr(offload.Offloaded, "update", watched)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", record)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for captured in batches[1:]:
                offloaded.update(captured)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    offloaded.close()
    print(f"{place}: {len(syncs)} synchronising calls on the main thread, {sum(on for on, _ in syncs)} in update")
    assert not [message for on, message in syncs if on], "the handover waited for the GPU"
