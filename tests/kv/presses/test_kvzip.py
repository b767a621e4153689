"""`kvzip` against numpy: the pairs evicted per layer when the ratio is shared by every layer (kvpress 0.5.5's
KVzipPress.compress_post: the int(N · r) lowest reconstruction scores of all layers, counted per layer, then the
lowest of each layer over its heads), or applied to each layer (`layerwise`); and a prefill without the scores."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY
from spectra.kv.presses.kvzip import KVzip, kvzip_keep, pruned_counts
from spectra.registry import PRESSES

from .conftest import KV_HEADS, make_prefill

LAYERS, LENGTH = 4, 50


def random_scores(seed: int) -> np.ndarray:
    """(layers, H_kv, L) distinct scores in (0, 1), each layer on its own scale so that layers lose different counts,
    the first 4 positions raised above all (as the reconstruction pass leaves them)."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0, 1, (LAYERS, KV_HEADS, LENGTH)) ** rng.uniform(0.5, 3.0, (LAYERS, 1, 1))
    scores[..., :4] = scores.max() + 1
    return scores


def numpy_evicted(scores: np.ndarray, ratio: float) -> np.ndarray:
    """(layers, H_kv, L) bool: the int(N · r) lowest of all N scores (distinct: no tie to break)."""
    flat = scores.reshape(-1)
    evicted = np.zeros(flat.size, dtype=bool)
    evicted[np.argsort(flat, kind="stable")[:int(flat.size * ratio)]] = True
    return evicted.reshape(scores.shape)


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5, 0.9])
def test_the_lowest_scores_of_all_layers_are_evicted_each_from_its_layer(ratio: float) -> None:
    scores = random_scores(int(ratio * 10))
    evicted = numpy_evicted(scores, ratio)
    counts = pruned_counts(torch.from_numpy(scores), ratio)
    np.testing.assert_array_equal(counts.numpy(), evicted.sum(axis=(1, 2)))
    assert len(set(counts.tolist())) > 1, "layers lose different counts"
    prefill, _ = make_prefill(length=LENGTH)
    for layer in range(LAYERS):
        part = KVzip().compress(dataclasses.replace(prefill, layer=layer, passes={"reconstruction": torch.from_numpy(scores)}),
                                ratio)
        np.testing.assert_array_equal(part.kept_mask(LENGTH).numpy(), ~evicted[layer])
        np.testing.assert_array_equal(part.counts().numpy(), (~evicted[layer]).sum(-1))
        assert part.saved == pytest.approx(evicted[layer].mean())
        assert part.kept_mask(LENGTH)[:, :4].all(), "the attention sinks stay"


def test_layerwise_evicts_the_same_share_of_every_layer() -> None:
    scores = random_scores(3)
    counts = pruned_counts(torch.from_numpy(scores), 0.3, layerwise=True)
    np.testing.assert_array_equal(counts.numpy(), [int(KV_HEADS * LENGTH * 0.3)] * LAYERS)
    prefill, _ = make_prefill(length=LENGTH)
    part = KVzip(layerwise=True).compress(dataclasses.replace(prefill, layer=2,
                                                              passes={"reconstruction": torch.from_numpy(scores)}), 0.3)
    layer = scores[2].reshape(-1)
    expected = np.ones(layer.size, dtype=bool)
    expected[np.argsort(layer, kind="stable")[:30]] = False
    np.testing.assert_array_equal(part.kept_mask(LENGTH).numpy(), expected.reshape(KV_HEADS, LENGTH))
    assert KVzip(layerwise=True).fresh().layerwise


def test_on_a_model_with_local_layers_the_global_layers_pairs_alone_are_ranked() -> None:
    """Layers 0 and 2 local (sliding windows, which keep their windows whatever the press): the int(N_global · r)
    lowest of the global layers' pairs are evicted, from the global layers, none counted to a local one."""
    scores = random_scores(5)
    press = REGISTRY["kvzip"].for_run(windows=[8, None, 8, None], layers=LAYERS)
    assert press.local == (True, False, True, False) and press.fresh().local == press.local
    evicted = numpy_evicted(scores[[1, 3]], 0.4)
    np.testing.assert_array_equal(press.counts(torch.from_numpy(scores), 0.4).numpy(),
                                  [0, evicted[0].sum(), 0, evicted[1].sum()])
    prefill, _ = make_prefill(length=LENGTH)
    part = press.compress(dataclasses.replace(prefill, layer=3, passes={"reconstruction": torch.from_numpy(scores)}),
                          0.4)
    np.testing.assert_array_equal(part.kept_mask(LENGTH).numpy(), ~evicted[1])
    assert REGISTRY["kvzip"].for_run(windows=[None] * LAYERS) is REGISTRY["kvzip"]


def test_a_layer_evicts_its_lowest_over_all_its_heads() -> None:
    scores = torch.tensor([[0.5, 0.1, 0.9, 0.3], [0.2, 0.8, 0.05, 0.7]])
    np.testing.assert_array_equal(kvzip_keep(scores, 3).numpy(), [[True, False, True, True],
                                                                   [False, True, False, True]])


def test_a_prefill_without_the_reconstruction_scores_is_refused() -> None:
    prefill, _ = make_prefill(length=LENGTH)
    with pytest.raises(ValueError, match="lacks 'reconstruction' \\(KVzip's reconstruction pass"):
        REGISTRY["kvzip"].compress(prefill, 0.5)


def test_it_declares_the_pass_and_its_kvpress_peer() -> None:
    assert PRESSES.facts("kvzip")["reads"] == ("reconstruction",) and "kvzip" in PRESSES.having("whole_model")
    assert not PRESSES.facts("kvzip").get("scorer"), "a global ranking, no per-layer scorer to wrap"
    assert KVzip.peer == "KVzipPress"


def test_one_instance_ranks_each_example_and_ratio_anew() -> None:
    """The press remembers the last ranking (every layer reads the same scores): other scores or another ratio
    rank again."""
    prefill, _ = make_prefill(length=LENGTH)
    press = KVzip()
    for seed, ratio in ((1, 0.3), (1, 0.6), (2, 0.6), (1, 0.3)):
        scores = torch.from_numpy(random_scores(seed))
        for layer in range(LAYERS):
            got = press.compress(dataclasses.replace(prefill, layer=layer, passes={"reconstruction": scores}), ratio)
            np.testing.assert_array_equal(got.kept_mask(LENGTH).numpy(), ~numpy_evicted(scores.numpy(), ratio)[layer])
