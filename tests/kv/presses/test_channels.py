"""ThinK zeroes, per key/value head, the key channels of smallest query·key energy (a numpy formula here), in the
context's keys only; values and the number of tokens stay."""

from __future__ import annotations

import numpy as np
import pytest

from spectra.kv.presses import REGISTRY

from .conftest import make_prefill


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_think_zeroes_the_lowest_scoring_key_channels_per_key_value_head(ratio: float) -> None:
    prefill, arrays = make_prefill(length=80)
    compressed = REGISTRY["think"].compress(prefill, ratio)
    queries = (arrays["q"][:, -32:] ** 2).mean(1).reshape(2, 3, 8).mean(1)
    scores = queries * (arrays["k"] ** 2).mean(1)
    pruned = int(8 * ratio)
    keys, values = compressed.rows(prefill.key, prefill.value)
    for head in range(2):
        dropped = np.argsort(scores[head])[:pruned]
        expected = arrays["k"][head].copy()
        expected[:, dropped] = 0
        np.testing.assert_array_equal(keys[head].numpy(), expected)
    np.testing.assert_array_equal(values.numpy(), arrays["v"])
    np.testing.assert_array_equal(compressed.kept.numpy(), np.tile(np.arange(80), (2, 1)))
    assert compressed.saved == pytest.approx(pruned / 8 / 2)
    assert np.array_equal(prefill.key.numpy(), arrays["k"]), "the prefill's keys are not changed in place"


def test_think_stores_the_kept_key_channels_every_value_and_a_channel_mask() -> None:
    prefill, _ = make_prefill(length=80)  # float64, d = 8
    for ratio, pruned in ((0.25, 2), (0.5, 4), (0.9, 7)):
        stored = REGISTRY["think"].compress(prefill, ratio).memory(prefill)
        assert stored.tolist() == [80 * (8 - pruned) * 8 + 80 * 8 * 8 + 1] * 2
