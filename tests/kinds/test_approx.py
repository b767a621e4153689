"""`spectra approx` as a registered analysis: its options, and the checks made from the model's shape before it
loads (layers, k plans, causal methods end to end on a decoder)."""

from __future__ import annotations

import json

import pytest

from spectra.checkpoints import Shape
from spectra.config import Projection, RunConfig
from spectra.errors import SpectraError
from spectra.kinds import REGISTRY
from spectra.kinds.approx import ApproxOptions
from spectra.options import identity

DECODER = Shape(layers=2, heads=4, positions=64, causal=True, name="tiny-llama")


def test_options_normalise_one_value_or_several() -> None:
    options = ApproxOptions(budget=(12, 4, 4), methods="svd", layers=1, projection="orthogonal")
    assert options.budget == (4, 12) and options.methods == ("svd",) and options.layers == (1,)
    assert options.projection is Projection.ORTHOGONAL
    resolved = options.resolved(16)
    assert identity(resolved)["budget"] == [4, 12] and identity(resolved)["methods"] == ["svd"]
    with pytest.raises(SpectraError, match="budget 12 exceeds the sequence length n = 8"):
        options.resolved(8)
    with pytest.raises(SpectraError, match="target must be a relative error in \\(0, 1\\)"):
        ApproxOptions(target=2.0)
    assert ApproxOptions(methods="linformer").resolved(512).methods[:2] == ("linformer(none)", "linformer(headwise)")
    assert ApproxOptions().resolved(512).budget == (128,)


def test_methods_that_calibrate_need_calibration_sequences() -> None:
    with pytest.raises(SpectraError, match="linformer-fit\\(kv\\) fits its parameters on calibration sequences: pass fit_samples=N"):
        ApproxOptions(methods="linformer-fit(kv)", budget=4).resolved(16)
    assert ApproxOptions(methods="linformer-fit(kv)", budget=4, fit_samples=2).resolved(16).fits


def test_a_k_plan_is_read_and_sets_the_uniform_budget(tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"n": 16, "layers": [{"layer": 0, "k_proj": 4}, {"layer": 1, "k_proj": 8}]}))
    options = ApproxOptions(methods="svd", k_plan=plan).resolved(16)
    assert options.k_plan == (4, 8) and options.budget == (6,)
    with pytest.raises(SpectraError, match="was made at n = 16"):
        ApproxOptions(methods="svd", k_plan=plan).resolved(32)
    with pytest.raises(SpectraError, match="the k plan has 2 layers but tiny has 3"):
        REGISTRY["approx"].check(RunConfig("m", "d", length=16), options, Shape(3, 4, 64, False, "tiny"))


def test_methods_that_look_ahead_are_refused_end_to_end_on_a_decoder_before_it_loads() -> None:
    options = ApproxOptions(methods="svd,window", budget=4, end_to_end=True).resolved(16)
    with pytest.raises(SpectraError, match="svd lets each query see future tokens") as raised:
        REGISTRY["approx"].check(RunConfig("m", "d", length=16), options, DECODER)
    assert "window" in str(raised.value) and "end_to_end=True" in str(raised.value)
    REGISTRY["approx"].check(RunConfig("m", "d", length=16), ApproxOptions(methods="window", budget=4,
                                                                           end_to_end=True).resolved(16), DECODER)
    with pytest.raises(SpectraError, match="layers must lie in 0…1 for tiny-llama"):
        REGISTRY["approx"].check(RunConfig("m", "d", length=16), ApproxOptions(layers=2, budget=4).resolved(16), DECODER)
