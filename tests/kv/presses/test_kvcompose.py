"""`kvcompose` against numpy written here from kvpress 0.5.5's KVComposePress (structured, its defaults): scores
raised by their layer's head mean, per-layer composite curves (mean of the heads' descending scores, layer 0 the
maximum curve), the layers' shares of the n_kept best composite values, each head's best of that count; bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.kvcompose import layer_counts

from .conftest import make_prefill

LAYERS, KV_HEADS, LENGTH = 4, 2, 100


def numpy_kvcompose(raw: np.ndarray, ratio: float, first: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(layers,) counts and (layers, H_kv, L) bool kept, from distinct replay scores (layers, H_kv, L); `first`:
    raise the first layer's curve to the largest (kvpress's rule for the model's layer 0)."""
    layers, heads, length = raw.shape
    scores = raw + raw.mean(axis=1, keepdims=True)
    composite = np.sort(scores, axis=-1)[..., ::-1].mean(axis=1)  # (layers, L)
    if first:
        composite[0] = composite.max(axis=0)
    flat = composite.ravel()
    best = np.argsort(-flat, kind="stable")[:max(1, int(flat.size * (1 - ratio)))]
    counts = np.maximum(np.bincount(best // length, minlength=layers), 1)
    kept = np.zeros(scores.shape, dtype=bool)
    for layer in range(layers):
        for head in range(heads):
            kept[layer, head, np.argsort(-scores[layer, head])[:counts[layer]]] = True
    return counts, kept


def replay(seed: int = 0) -> np.ndarray:
    """Replay scores whose level differs by layer (so layers earn different counts), float32 as kvpress holds them."""
    rng = np.random.default_rng(seed)
    levels = np.array([0.2, 1.0, 0.5, 0.05])[:, None, None]
    return (rng.uniform(0, 1, (LAYERS, KV_HEADS, LENGTH)) ** 3 * levels).astype(np.float32)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_each_layer_keeps_its_share_of_the_best_composite_values(ratio) -> None:
    raw = replay()
    counts, kept = numpy_kvcompose(raw.astype(np.float64), ratio)
    composed = torch.from_numpy(raw)
    prefill, _ = make_prefill(length=LENGTH)
    press = REGISTRY["kvcompose"].fresh()
    parts = [press.compress(dataclasses.replace(prefill, layer=layer, passes={"composition": composed}), ratio)
             for layer in range(LAYERS)]
    for layer, part in enumerate(parts):
        np.testing.assert_array_equal(part.counts().numpy(), [counts[layer]] * KV_HEADS)
        np.testing.assert_array_equal(part.kept_mask(LENGTH).numpy(), kept[layer])
        assert part.valid is None, "the heads of a layer keep the same count"
    # the layers' shares sum to n_kept, raised by one for each layer that held none (it keeps one)
    assert n_kept(LAYERS * LENGTH, ratio) <= counts.sum() <= n_kept(LAYERS * LENGTH, ratio) + LAYERS - 1
    assert len(set(counts.tolist())) > 1, "the layers keep different counts"
    assert counts[0] >= counts.max() - 1, "layer 0 competes with the largest curve (one tie may cut it)"


def test_layer_zero_takes_the_largest_curve() -> None:
    scores = torch.zeros(3, 1, 4)
    scores[0, 0] = torch.tensor([0.0, 0.0, 0.0, 0.1])  # layer 0 scores low, layer 2 high
    scores[1, 0] = torch.tensor([0.2, 0.2, 0.2, 0.2])
    scores[2, 0] = torch.tensor([0.9, 0.8, 0.7, 0.6])
    # raised by their (one-head) mean: doubled. Layer 0's curve becomes layer 2's, so the 6 best of 12 composite
    # values are 1.8, 1.6, 1.4 of layers 0 and 2 each; layer 1 holds none and keeps 1
    assert layer_counts(scores, 0.5).tolist() == [3, 1, 3]


@pytest.mark.parametrize("windows", [[8, None, 8, None], [None, 8, None, 8]])
def test_on_a_model_with_local_layers_the_global_layers_share_the_budget(windows) -> None:
    """Local layers (window 8) keep their windows whatever the press (`--local-layers keep`): the n_kept(N_global, r)
    best composite values of the global layers alone fix their counts, layer 0's curve raised to the largest only
    where layer 0 is global (kvpress's rule for the model's first layer)."""
    raw, ratio = replay(2), 0.5
    chosen = [layer for layer, window in enumerate(windows) if window is None]
    counts, kept = numpy_kvcompose(raw[chosen].astype(np.float64), ratio, first=chosen[0] == 0)
    press = REGISTRY["kvcompose"].for_run(windows=windows, layers=LAYERS)
    assert press.local == tuple(window is not None for window in windows) and press.fresh().local == press.local
    prefill, _ = make_prefill(length=LENGTH)
    for at, layer in enumerate(chosen):
        part = press.compress(dataclasses.replace(prefill, layer=layer, passes={"composition": torch.from_numpy(raw)}),
                              ratio)
        np.testing.assert_array_equal(part.counts().numpy(), [counts[at]] * KV_HEADS)
        np.testing.assert_array_equal(part.kept_mask(LENGTH).numpy(), kept[at])
    assert n_kept(2 * LENGTH, ratio) <= counts.sum() <= n_kept(2 * LENGTH, ratio) + 1
    unwindowed, _ = numpy_kvcompose(raw.astype(np.float64), ratio)
    assert not np.array_equal(unwindowed[chosen], counts), "ranked among all layers, the counts would differ"
    assert REGISTRY["kvcompose"].for_run(windows=[None] * LAYERS) is REGISTRY["kvcompose"]


def test_bad_input_and_facts() -> None:
    prefill, _ = make_prefill(length=LENGTH)
    with pytest.raises(ValueError, match="lacks 'composition' \\(KVCompose's replay"):
        REGISTRY["kvcompose"].compress(prefill, 0.5)
    press = REGISTRY["kvcompose"]
    assert press.reads == ("composition",) and press.peer == "KVComposePress"
    assert press.fresh() is not press
