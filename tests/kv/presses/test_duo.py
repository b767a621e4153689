"""DuoAttention against numpy: the round(r · N) lowest-scored key/value heads of the pattern stream, keeping the
first sink_size and last recent_size tokens (kvpress 0.5.5's slice [sink : −recent]); the others keep everything."""

from __future__ import annotations

import numpy as np
import pytest

from spectra.kv import headpattern
from spectra.kv.presses import REGISTRY
from spectra.kv.presses.duo import streaming_heads

from .conftest import make_prefill


@pytest.fixture
def pattern(tmp_path):
    scores = np.array([[0.9, 0.1], [0.3, 0.7], [0.05, 0.6]])
    return headpattern.write(tmp_path / "pattern", scores, 4, 16), scores


@pytest.mark.parametrize("ratio", [0.2, 0.5, 0.9])
def test_duo_keeps_sink_and_recent_on_the_lowest_heads(pattern, ratio) -> None:
    folder, scores = pattern
    press = REGISTRY[f"duo({folder})"]
    streaming = np.zeros(6, dtype=bool)
    streaming[np.argsort(scores.ravel())[:round(6 * ratio)]] = True
    streaming = streaming.reshape(3, 2)
    for layer in range(3):
        prefill, _ = make_prefill(length=100)
        prefill = type(prefill)(layer, *[getattr(prefill, f) for f in ("q", "key", "value", "key_pre", "window",
                                                                        "scaling", "seed", "index")])
        part = press.compress(prefill, ratio)
        want = np.ones((2, 100), dtype=bool)
        want[streaming[layer], 4:84] = False
        np.testing.assert_array_equal(part.kept_mask(100).numpy(), want)
        assert part.saved == pytest.approx(1 - want.sum() / 200)
    np.testing.assert_array_equal(streaming_heads(scores, ratio), streaming)


def test_no_recent_window_masks_nothing_as_in_kvpress(tmp_path) -> None:
    folder = headpattern.write(tmp_path / "p", np.zeros((1, 2)), 4, 0)
    part = REGISTRY[f"duo({folder})"].compress(make_prefill(length=50)[0], 1.0 - 1e-9)
    assert part.kept_mask(50).all(), "kvpress's slice [4:-0] is empty"


def test_a_pattern_of_another_shape_is_refused(pattern) -> None:
    folder, _ = pattern
    with pytest.raises(ValueError, match="3 × 2"):
        REGISTRY[f"duo({folder})"].compress(make_prefill()[0].__class__(5, *[getattr(make_prefill()[0], f) for f in (
            "q", "key", "value", "key_pre", "window", "scaling", "seed", "index")]), 0.5)
