"""kvpress's PrefillDecodingPress with one scorer in both roles: after the prefill it keeps the scorer's n_kept(L, r)
best context rows (knorm: numpy's smallest key norms; streaming: the sinks and the recent window) in torch.topk's
order, and while decoding it is decoding(…) at that size; bad input is refused. (Whole answers against a dense
forward that hides the evicted rows: tests/kv/test_generation.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept, run_presses
from spectra.kv.presses.decoding import DecodingPress
from spectra.kv.presses.prefilldecoding import PrefillDecodingPress
from spectra.registry import PRESSES, press_names

from .conftest import make_prefill


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_after_the_prefill_it_keeps_the_scorers_best_rows_in_topk_order(ratio) -> None:
    prefill, arrays = make_prefill()
    compressed = REGISTRY["prefill_decoding(knorm)"].compress(prefill, ratio)
    keep = max(1, int(100 * (1 - ratio)))
    norms = np.linalg.norm(arrays["k"], axis=-1)
    np.testing.assert_array_equal(compressed.kept.numpy(), np.argsort(norms, axis=-1, kind="stable")[:, :keep])
    assert compressed.saved == pytest.approx(1 - keep / 100)
    evicted = REGISTRY["knorm"].compress(prefill, ratio)  # the same rows as the press alone, there in position order
    np.testing.assert_array_equal(np.sort(compressed.kept.numpy(), axis=-1), evicted.kept.numpy())


def test_streaming_keeps_the_sinks_and_the_window() -> None:
    prefill, _ = make_prefill()
    kept = REGISTRY["prefill_decoding(streaming)"].compress(prefill, 0.5).kept.numpy()
    for head in kept:
        assert sorted(head.tolist()) == [0, 1, 2, 3, *range(54, 100)]
    scores = REGISTRY["streaming"].score(prefill, 0.5)
    np.testing.assert_array_equal(kept, torch.topk(scores, 50, dim=-1).indices.numpy())


def test_while_decoding_it_is_decoding_at_the_prefills_size() -> None:
    built = run_presses(["prefill_decoding(tova)"], compression_interval=5)["prefill_decoding(tova)"]
    assert isinstance(built, PrefillDecodingPress) and isinstance(built, DecodingPress) and built.interval == 5
    assert built.label == "prefill_decoding(tova)" and type(built.fresh()) is PrefillDecodingPress
    assert built.target(100, 0.75) == n_kept(100, 0.75) == 25 and built.size(25, 400, 0.75) == 25
    facts = dict(PRESSES.facts("prefill_decoding(knorm)"))
    assert facts["peer"] == "PrefillDecodingPress" and facts["decodes"] and facts["interval"] == 512


def test_bad_input_is_refused() -> None:
    with pytest.raises(TypeError, match="prefill_decoding wraps a decodable scorer press, not snapkv"):
        REGISTRY["prefill_decoding"].bind(REGISTRY["snapkv"])
    for name, message in (
            ("prefill_decoding(snapkv)", ("prefill_decoding wraps a decodable press, and 'snapkv' is not one; "
                                          "decodables: streaming, knorm, tova$")),
            ("prefill_decoding", "takes an argument: prefill_decoding\\(<decodable>\\)$"),
            ("prefill_decoding(decoding(knorm))", "'decoding\\(knorm\\)' is not one")):
        with pytest.raises(SpectraError, match=message):
            press_names([name])
    prefill, _ = make_prefill()
    with pytest.raises(ValueError, match="prefill_decoding needs a scorer press"):
        REGISTRY["prefill_decoding"].compress(prefill, 0.5)
