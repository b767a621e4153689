"""`simlayerkv` against numpy: the lazy score (the last queries' attention on the initial and recent keys, averaged
over them and every query head) from the causal attention written in conftest, the kept rows of a lazy layer
(kvpress 0.5.5's SimLayerKVPress, `keys[:n_initial]` and `keys[-n_recent + n_last:]`), and its defaults, at which it
compresses nothing."""

from __future__ import annotations

import numpy as np
import pytest

from spectra.kv.presses import REGISTRY
from spectra.kv.presses.simlayerkv import SimLayerKV
from spectra.registry import PRESSES

from .conftest import make_prefill


def numpy_laziness(p: np.ndarray, n_last: int, n_recent: int, n_initial: int) -> float:
    """Σ over the first n_initial and the last n_recent of the L − n_last keys of the last n_last rows of P,
    averaged over those rows and all query heads."""
    weights = p[:, -n_last:, : p.shape[-1] - n_last].mean(axis=(0, 1))
    return float(weights[:n_initial].sum() + weights[-n_recent:].sum())


@pytest.mark.parametrize(("n_last", "n_recent", "n_initial"), [(1, 32, 4), (3, 20, 2), (1, 60, 0)])
def test_the_lazy_score_equals_numpy(n_last: int, n_recent: int, n_initial: int) -> None:
    prefill, arrays = make_prefill(length=100, seed=3)
    press = SimLayerKV(0.5, n_last, n_recent, n_initial)
    assert press.laziness(prefill) == pytest.approx(numpy_laziness(arrays["p"], n_last, n_recent, n_initial),
                                                    abs=1e-12)


@pytest.mark.parametrize(("n_last", "n_recent", "n_initial"), [(1, 32, 4), (3, 20, 2)])
def test_a_lazy_layer_keeps_its_initial_and_recent_tokens_and_another_every_token(n_last: int, n_recent: int,
                                                                                    n_initial: int) -> None:
    length = 100
    prefill, arrays = make_prefill(length=length, seed=9)
    score = numpy_laziness(arrays["p"], n_last, n_recent, n_initial)
    lazy = SimLayerKV(score - 1e-9, n_last, n_recent, n_initial).compress(prefill, 0.5)
    expected = np.r_[np.arange(n_initial), np.arange(length - n_recent + n_last, length)]
    np.testing.assert_array_equal(lazy.kept.numpy(), np.stack([expected, expected]))
    assert lazy.saved == pytest.approx(1 - (n_initial + n_recent - n_last) / length)
    if n_last == 1:  # kvpress's own compression ratio for its default n_last
        assert lazy.saved == pytest.approx((length - n_initial - n_recent + 1) / length)
    busy = SimLayerKV(min(score + 1e-9, 1.0 - 1e-9), n_last, n_recent, n_initial).compress(prefill, 0.5)
    np.testing.assert_array_equal(busy.kept.numpy(), np.tile(np.arange(length), (2, 1)))
    assert busy.saved == 0
    for ratio in (0.1, 0.9):  # the ratio is ignored
        np.testing.assert_array_equal(SimLayerKV(score - 1e-9, n_last, n_recent, n_initial)
                                      .compress(prefill, ratio).kept.numpy(), lazy.kept.numpy())


def test_at_kvpress_defaults_nothing_is_compressed() -> None:
    prefill, _ = make_prefill(length=100)
    press = REGISTRY["simlayerkv"]
    assert (press.lazy_threshold, press.n_last, press.n_recent, press.n_initial) == (1.0, 1, 1024, 4)
    assert press.compress(prefill, 0.5).saved == 0, "a threshold of 1.0 compresses nothing"
    assert SimLayerKV(0.0).compress(prefill, 0.5).saved == 0, "nor a context of at most 4 + 1024 + 1 tokens"
    assert SimLayerKV(0.0, n_recent=91).compress(prefill, 0.5).kept.shape == (2, 4 + 90)
    assert SimLayerKV(0.0, n_recent=95).compress(prefill, 0.5).saved == 0, "L = 100 ≤ 4 + 95 + 1"


def test_bad_settings_are_refused_in_one_line() -> None:
    for arguments, message in (({"lazy_threshold": 1.5}, "lazy_threshold must lie in"),
                               ({"n_last": 65}, "last 1 to 64 context queries"),
                               ({"n_last": 8, "n_recent": 8}, "n_recent > n_last"),
                               ({"n_initial": -1}, "n_initial ≥ 0")):
        with pytest.raises(ValueError, match=message) as caught:
            SimLayerKV(**arguments)
        assert "\n" not in str(caught.value)


def test_its_facts() -> None:
    facts = PRESSES.facts("simlayerkv")
    assert not facts.get("windowed") and not facts.get("scorer") and facts["ratio_means"].startswith("ignored")
    assert type(REGISTRY["simlayerkv"]).peer == "SimLayerKVPress"
    assert REGISTRY["simlayerkv"].fresh() is not REGISTRY["simlayerkv"]
