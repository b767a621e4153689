"""`pyramidkv` against numpy: SnapKV's score written here from the attention rows, each layer keeping the budget of
kvpress 0.5.5's PyramidKVPress.get_layer_budget (written here again, from its source's formula); the run's instance
bound to the layer count, the registry's refusing to compress."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept, run_presses
from spectra.registry import PRESSES, chosen

from .conftest import make_prefill

WINDOW, KERNEL, BETA = 64, 5, 20


def kvpress_budget(length: int, ratio: float, layer: int, layers: int) -> int:
    """PyramidKVPress.get_layer_budget at window 64, beta 20, in plain floats."""
    capacity = WINDOW + length * (1 - ratio)
    low = (capacity - WINDOW) / BETA
    high = (capacity - WINDOW) * 2 - low
    if high >= length - WINDOW:
        high = length - WINDOW
        low = (capacity - WINDOW) * 2 - high
    if not length >= high >= low >= WINDOW:
        return max(1, round(length * (1 - ratio)))
    return round(high - layer * ((high - low) / (layers - 1) if layers > 1 else 0.0))


def snapkv_scores(p: np.ndarray, length: int) -> np.ndarray:
    """(2, L): the window's mean attention to each earlier key, pooled (zero padding counted), group-averaged, the
    window's tokens scored above everything."""
    attention = p[:, -WINDOW:, : length - WINDOW].mean(1)
    padded = np.pad(attention, ((0, 0), (KERNEL // 2, KERNEL // 2)))
    pooled = np.stack([padded[:, j: j + KERNEL].mean(-1) for j in range(length - WINDOW)], axis=-1)
    scores = pooled.reshape(2, 3, -1).mean(1)
    return np.concatenate([scores, np.full((2, WINDOW), scores.max() + 1)], axis=1)


def top(scores: np.ndarray, count: int) -> np.ndarray:
    return np.sort(np.argsort(-scores, axis=-1, kind="stable")[:, :count], axis=-1)


@pytest.mark.parametrize(("length", "ratio"), [(200, 0.5), (200, 0.4), (240, 0.3)])
def test_each_layer_keeps_its_pyramid_budget_of_snapkv_tokens(length: int, ratio: float) -> None:
    prefill, arrays = make_prefill(length=length, seed=2)
    layers = 5
    press = run_presses(["pyramidkv"], layers=layers)["pyramidkv"]
    scores = snapkv_scores(arrays["p"], length)
    budgets = [kvpress_budget(length, ratio, layer, layers) for layer in range(layers)]
    assert budgets[0] > budgets[-1] >= WINDOW, "a ramp, lower layers keeping more"
    assert abs(sum(budgets) - layers * n_kept(length, ratio)) <= layers, "about the uniform ratio's tokens in all"
    for layer, budget in enumerate(budgets):
        compressed = press.compress(dataclasses.replace(prefill, layer=layer), ratio)
        np.testing.assert_array_equal(compressed.kept.numpy(), top(scores, budget))
        assert compressed.saved == pytest.approx(1 - budget / length)
        assert set(range(length - WINDOW, length)) <= set(compressed.kept[0].tolist()), "the window is kept"
    assert not np.array_equal(press.compress(prefill, ratio).kept[0].numpy(), press.compress(prefill, ratio).kept[1])


@pytest.mark.parametrize(("length", "ratio"), [(100, 0.5), (200, 0.25), (200, 0.9), (120, 0.5)])
def test_where_the_ramp_does_not_fit_every_layer_keeps_the_rounded_uniform_count(length: int, ratio: float) -> None:
    prefill, arrays = make_prefill(length=length, seed=5)
    press = REGISTRY["pyramidkv"].for_run(layers=3)
    expected = max(1, round(length * (1 - ratio)))
    for layer in range(3):
        assert press.budget(length, ratio, layer) == kvpress_budget(length, ratio, layer, 3) == expected
    if expected > WINDOW:
        np.testing.assert_array_equal(press.compress(prefill, ratio).kept.numpy(),
                                      top(snapkv_scores(arrays["p"], length), expected))


def test_round_not_int_in_the_fallback_can_keep_one_more_than_snapkv() -> None:
    length, ratio = 100, 0.494  # L(1 − r) = 50.6: the ramp does not fit; round keeps 51, kvpress's n_kept 50
    prefill, _ = make_prefill(length=length, seed=1)
    press = REGISTRY["pyramidkv"].for_run(layers=2)
    assert press.budget(length, ratio, 1) == kvpress_budget(length, ratio, 1, 2) == 51 and n_kept(length, ratio) == 50
    assert press.compress(dataclasses.replace(prefill, layer=1), ratio).kept.shape == (2, 51)
    assert REGISTRY["snapkv"].compress(prefill, ratio).kept.shape == (2, 50)


def test_the_registered_press_is_unbound_and_refuses_to_compress() -> None:
    prefill, _ = make_prefill(length=100)
    with pytest.raises(ValueError, match="layer count") as caught:
        REGISTRY["pyramidkv"].compress(prefill, 0.5)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="bound to 2 layers, not to layer 2"):
        REGISTRY["pyramidkv"].for_run(layers=2).compress(dataclasses.replace(prefill, layer=2), 0.5)
    with pytest.raises(ValueError, match="positive layer count"):
        REGISTRY["pyramidkv"].for_run(layers=0)
    with pytest.raises(ValueError, match="more than 64 context tokens"):
        REGISTRY["pyramidkv"].for_run(layers=2).compress(make_prefill(length=64)[0], 0.5)
    assert REGISTRY["pyramidkv"].fresh().layers is None and REGISTRY["pyramidkv"].for_run(layers=4).fresh().layers == 4


def test_its_facts_are_snapkvs_but_no_wrapper_takes_it() -> None:
    facts = PRESSES.facts("pyramidkv")
    assert facts["windowed"] and facts["window"] == WINDOW and not facts.get("scorer")
    assert PRESSES.facts("snapkv")["scorer"], "snapkv itself is a scorer"
    with pytest.raises(SpectraError, match="pyramidkv") as caught:
        chosen(["adakv(pyramidkv)"], PRESSES, example="snapkv", flag="--presses")
    assert "\n" not in str(caught.value)
    assert type(REGISTRY["pyramidkv"]).peer == "PyramidKVPress"
