"""`spectra analyze` as a registered analysis: its options, the checks made before the model loads, its run."""

from __future__ import annotations

import pytest

import spectra
from spectra.checkpoints import Shape
from spectra.config import RunConfig
from spectra.errors import SpectraError
from spectra.kinds import REGISTRY
from spectra.kinds.analyze import AnalyzeOptions
from spectra.options import identity


def test_options_resolve_and_identify_the_run() -> None:
    assert AnalyzeOptions().resolved(512).at == 128 and AnalyzeOptions(at=5).resolved(8).at == 5
    with pytest.raises(SpectraError, match="at must be an index in 1…8"):
        AnalyzeOptions(at=9).resolved(8)
    with pytest.raises(SpectraError, match="unknown spectrum_device 'gpu'; use one of auto, cpu, same, cuda"):
        AnalyzeOptions(spectrum_device="gpu")
    for wrong in (0, 1e-7, 1.0, True, "1e-4"):
        with pytest.raises(SpectraError, match=r"spectrum_tolerance must be a number in \[1e-6, 1\)"):
            AnalyzeOptions(spectrum_tolerance=wrong)
    assert AnalyzeOptions(spectrum_tolerance=1e-4).spectrum_tolerance == 1e-4
    with pytest.raises(SpectraError, match="bootstrap must be a number of replicates ≥ 0, got -1"):
        AnalyzeOptions(bootstrap=-1)
    chosen = AnalyzeOptions(layers="0,2", heads=1, bootstrap=50, overlap=True).resolved(16)
    assert (chosen.layers, chosen.heads) == ((0, 2), (1,))
    assert identity(chosen) == {"at": 4, "qkv": None, "layers": [0, 2], "heads": [1],
                                "bootstrap": 50}, "where and when the spectra run changes no number: no identity"


@pytest.mark.parametrize("options, shape, message", [
    (AnalyzeOptions(layers=(0, 6)), Shape(6, 12, 512, False, "MiniLM"), "layers must lie in 0…5 for MiniLM"),
    (AnalyzeOptions(heads=(12,)), Shape(6, 12, 512, False, "MiniLM"), "heads must lie in 0…11 for MiniLM"),
    (AnalyzeOptions(), Shape(6, 12, 256, False, "MiniLM"), "length=512 exceeds what MiniLM can embed"),
])
def test_what_the_model_rules_out_is_refused_from_its_shape(options, shape, message) -> None:
    with pytest.raises(SpectraError, match=message):
        REGISTRY["analyze"].check(RunConfig("m", "d", length=512), options, shape)
    REGISTRY["analyze"].check(RunConfig("m", "d", length=8), AnalyzeOptions(), Shape(name="a hub id"))


def test_the_batched_route_asked_for_without_a_gpu_is_refused_before_the_model_loads(monkeypatch) -> None:
    import torch

    analyze, shape = REGISTRY["analyze"], Shape(6, 12, 512, False, "MiniLM")
    with pytest.raises(SpectraError, match="spectrum_device=\"cuda\" runs on the model's CUDA device; use device"):
        analyze.check(RunConfig("m", "d", length=512, device="cpu"), AnalyzeOptions(spectrum_device="cuda"), shape)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpectraError, match="needs a CUDA device, and torch sees none"):
        analyze.check(RunConfig("m", "d", length=512), AnalyzeOptions(spectrum_device="cuda"), shape)


def test_the_api_function_is_built_from_the_declarations() -> None:
    import inspect

    parameters = inspect.signature(spectra.analyze).parameters
    assert list(parameters)[:2] == ["model", "data"] and parameters["samples"].default == 10000
    assert {"at", "layers", "bootstrap", "out", "resume", "progress", "notify"} <= set(parameters)
    assert inspect.signature(spectra.approx).parameters["samples"].default == 1000, "its own default"
    assert "spectrum_device" in spectra.analyze.__doc__ and spectra.analyze.__name__ == "analyze"
    with pytest.raises(TypeError, match="unexpected keyword argument 'budgets'"):
        spectra.analyze("m", "d", budgets=4)


@pytest.mark.cuda
def test_on_cuda_the_spectra_are_the_cpus(roberta_dir, text_file, tmp_path) -> None:
    """The capture and the spectra on the GPU (each spectrum route, inline and overlapped) give the CPU's c to
    within float32 rounding of P; in half precision, c moves by the rounding of the forward pass only."""
    import pandas as pd

    quiet = dict(length=32, samples=16, batch_size=4, progress=None, notify=lambda line: None)

    def c_at(out, **options) -> pd.Series:
        run = spectra.analyze(str(roberta_dir), str(text_file), out=tmp_path / out, **quiet, **options)
        return pd.read_csv(run.path / "metrics.csv").set_index(["layer", "head"])["c_at_mean"]

    cpu = c_at("cpu", device="cpu")
    for place, overlap in (("same", False), ("same", True), ("cpu", True), ("auto", None), ("cuda", None),
                           ("cuda", False)):
        gpu = c_at(f"gpu-{place}-{overlap}", device="cuda", spectrum_device=place, overlap=overlap)
        assert (gpu - cpu).abs().max() <= 1e-5, (place, overlap)
    float32 = c_at("gpu-cuda-float32", device="cuda", spectrum_device="cuda", spectrum_tolerance=1e-4)
    assert (float32 - cpu).abs().max() <= 1e-4 + 1e-5
    for dtype in ("float16", "bfloat16"):  # 8 / 11 mantissa bits fewer than float32 in q, k and P
        assert (c_at(dtype, device="cuda", dtype=dtype) - cpu).abs().max() <= 2e-2, dtype
