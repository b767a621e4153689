"""`kvgrad` against numpy: the pairs evicted per layer when the ratio is shared by every layer (kvpress 0.5.5's
KVgradPress inherits KVzipPress.compress_post: the int(N · r) lowest attribution scores of all layers, counted per
layer, then the lowest of each layer over its heads), or applied to each layer (`layerwise`); its facts; and a
prefill without the scores. The scores themselves are tested with their pass (tests/kv/test_gradient.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY
from spectra.kv.presses.kvgrad import KVgrad
from spectra.registry import PRESSES

from .conftest import KV_HEADS, make_prefill

LAYERS, LENGTH = 4, 50


def random_scores(seed: int) -> np.ndarray:
    """(layers, H_kv, L) distinct scores, each layer on its own scale, the first 4 positions above all (as the
    attribution pass leaves them)."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0, 1, (LAYERS, KV_HEADS, LENGTH)) * rng.uniform(1, 1e3, (LAYERS, 1, 1))
    scores[..., :4] = scores.max() + 1
    return scores


def numpy_evicted(scores: np.ndarray, ratio: float, layerwise: bool = False) -> np.ndarray:
    """(layers, H_kv, L) bool: the int(N · r) lowest of all N scores, or int(H_kv · L · r) per layer."""
    if layerwise:
        return np.stack([numpy_evicted(layer[None], ratio)[0] for layer in scores])
    flat = scores.reshape(-1)
    evicted = np.zeros(flat.size, dtype=bool)
    evicted[np.argsort(flat, kind="stable")[:int(flat.size * ratio)]] = True
    return evicted.reshape(scores.shape)


@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5, 0.9])
@pytest.mark.parametrize("layerwise", [False, True])
def test_the_lowest_scores_are_evicted(ratio: float, layerwise: bool) -> None:
    scores = random_scores(int(ratio * 100))
    evicted = numpy_evicted(scores, ratio, layerwise)
    prefill, _ = make_prefill(length=LENGTH)
    press = KVgrad(layerwise=layerwise)
    for layer in range(LAYERS):
        part = press.compress(dataclasses.replace(prefill, layer=layer, passes={"gradient": torch.from_numpy(scores)}), ratio)
        np.testing.assert_array_equal(part.kept_mask(LENGTH).numpy(), ~evicted[layer])
        assert part.saved == pytest.approx(evicted[layer].mean())
        assert part.kept_mask(LENGTH)[:, :4].all(), "the attention sinks stay"
    if not layerwise:
        assert len(set(evicted.sum(axis=(1, 2)).tolist())) > 1, "layers lose different counts"
    assert press.fresh().layerwise == layerwise


def test_kept_rows_are_the_cached_rows_of_the_kept_positions() -> None:
    scores = random_scores(5)
    prefill, arrays = make_prefill(length=LENGTH)
    part = KVgrad().compress(dataclasses.replace(prefill, passes={"gradient": torch.from_numpy(scores)}), 0.5)
    key, value = part.rows(prefill.key, prefill.value)
    for head in range(KV_HEADS):
        kept = np.flatnonzero(~numpy_evicted(scores, 0.5)[0, head])
        count = len(kept)
        np.testing.assert_array_equal(key[head, :count].numpy(), arrays["k"][head, kept])
        np.testing.assert_array_equal(value[head, :count].numpy(), arrays["v"][head, kept])


def test_it_reads_the_attribution_scores_not_the_reconstruction() -> None:
    scores, other = random_scores(1), random_scores(2)
    prefill, _ = make_prefill(length=LENGTH)
    part = KVgrad().compress(dataclasses.replace(prefill, passes={"gradient": torch.from_numpy(scores),
                                                                  "reconstruction": torch.from_numpy(other)}), 0.5)
    np.testing.assert_array_equal(part.kept_mask(LENGTH).numpy(), ~numpy_evicted(scores, 0.5)[0])


def test_it_declares_the_pass_and_its_kvpress_peer() -> None:
    facts = PRESSES.facts("kvgrad")
    assert facts["reads"] == ("gradient",) and "kvgrad" in PRESSES.having("gradient") & PRESSES.having("whole_model")
    assert not facts.get("reconstruction") and not facts.get("scorer"), "its own pass, a global ranking"
    assert KVgrad.peer == "KVgradPress"


def test_a_prefill_without_the_attribution_scores_is_refused() -> None:
    prefill, _ = make_prefill(length=LENGTH)
    with pytest.raises(ValueError, match="lacks 'gradient' \\(KVgrad's gradient pass"):
        REGISTRY["kvgrad"].compress(prefill, 0.5)


@pytest.mark.parametrize("name, message", [("adakv(kvgrad)", "'kvgrad' is not one"),
                                           ("decoding(kvgrad)", "'kvgrad' is not one"),
                                           ("composed(knorm,kvgrad)", "'kvgrad' is not one")])
def test_wrappers_it_cannot_go_in_are_refused_in_one_line(name: str, message: str) -> None:
    with pytest.raises(SpectraError, match=message) as caught:
        PRESSES.resolve(name)
    assert "\n" not in str(caught.value)
