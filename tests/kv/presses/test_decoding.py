"""kvpress's DecodingPress, one layer at a time: the ratio it hands its scorer keeps exactly the target, it is due
as kvpress's hook decides, it keeps what its scorer ranks first (knorm: numpy norms; tova: the last query's softmax
over every row, mean over the query heads, itself kept) in torch.topk's order, and it compresses nothing after the
prefill. (Whole answers against a dense forward that hides the evicted rows: tests/test_decoding.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept, run_presses
from spectra.kv.presses.decoding import INTERVAL, DecodingPress, ratio_for

from .conftest import DIM, HEADS, KV_HEADS, make_prefill


def test_the_ratio_keeps_exactly_the_target() -> None:
    for rows in range(1, 700):
        for target in range(1, rows + 3):
            ratio = ratio_for(rows, target)
            assert (ratio == 0.0) if rows <= target else (0 < ratio < 1 and n_kept(rows, ratio) == target)


def test_due_after_the_interval_or_a_step_of_target_tokens() -> None:
    press = REGISTRY["decoding(knorm)"].for_run(compression_interval=4)
    assert isinstance(press, DecodingPress) and press.interval == 4 and press.label == "decoding(knorm)"
    assert REGISTRY["decoding(tova)"].interval == INTERVAL
    assert [press.due(steps, 1, 10) for steps in range(1, 6)] == [False, False, False, True, True]
    assert press.due(1, 10, 10) and not press.due(1, 9, 10)


def rows(length: int = 90, seed: int = 1):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((HEADS, 3, DIM))
    key = rng.standard_normal((KV_HEADS, length, DIM)) * rng.uniform(0.5, 2.0, (KV_HEADS, length, 1))
    value = rng.standard_normal((KV_HEADS, length, DIM))
    return q, key, value


def test_knorm_keeps_the_smallest_norms_in_topk_order() -> None:
    q, key, value = rows()
    kept = REGISTRY["decoding(knorm)"].keep(0, torch.from_numpy(q), torch.from_numpy(key), torch.from_numpy(value),
                                         DIM ** -0.5, 30)
    norms = np.linalg.norm(key, axis=-1)
    np.testing.assert_array_equal(kept.numpy(), np.argsort(norms, axis=-1, kind="stable")[:, :30])


def test_tova_keeps_what_the_last_query_attends_to_and_itself() -> None:
    q, key, value = rows()
    kept = REGISTRY["decoding(tova)"].keep(0, torch.from_numpy(q), torch.from_numpy(key), torch.from_numpy(value),
                                        DIM ** -0.5, 30)
    keys = np.repeat(key, HEADS // KV_HEADS, axis=0)
    scores = np.einsum("hd,hjd->hj", q[:, -1], keys) * DIM ** -0.5
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    mean = (weights / weights.sum(-1, keepdims=True)).mean(0)[:-1]
    expected = np.r_[89, np.argsort(-mean, kind="stable")[:29]]
    np.testing.assert_array_equal(kept.numpy(), np.stack([expected, expected]))


def test_nothing_is_dropped_below_the_target_or_after_the_prefill() -> None:
    q, key, value = (torch.from_numpy(array) for array in rows(length=20))
    assert REGISTRY["decoding(knorm)"].keep(0, q, key, value, 1.0, 20) is None
    prefill, _ = make_prefill()
    compressed = REGISTRY["decoding(streaming)"].compress(prefill, 0.75)
    np.testing.assert_array_equal(compressed.kept.numpy(), np.tile(np.arange(100), (2, 1)))
    assert compressed.saved == 0.0 and REGISTRY["decoding(streaming)"].target(100, 0.75) == 25


def test_it_wraps_decodable_scorers_only() -> None:
    with pytest.raises(TypeError, match="decoding wraps a decodable scorer press, not lowrank"):
        REGISTRY["decoding"].bind(REGISTRY["lowrank"])
    with pytest.raises(TypeError, match="decoding wraps a decodable scorer press, not snapkv"):
        REGISTRY["decoding"].bind(REGISTRY["snapkv"])
    decodable = REGISTRY.having("decodable")
    assert {"knorm", "streaming", "tova"} <= decodable and not {"snapkv", "observed", "loki", "random"} & decodable


def test_a_run_sets_the_interval_and_the_press_declares_its_target() -> None:
    """The interval is the run's; the default is the one its file declares (what --compression-interval defaults to);
    the press says it acts while decoding through its target, which a press compressing once has not (its bytes and
    kept share at that target: tests/test_cell.py)."""
    built = run_presses(["knorm", "decoding(knorm)"], compression_interval=7)
    assert built["knorm"] is REGISTRY["knorm"] and built["decoding(knorm)"].interval == 7
    assert REGISTRY["decoding(knorm)"].interval == INTERVAL == 512  # the registry's own is left as it was
    assert REGISTRY.facts("decoding(knorm)")["interval"] == INTERVAL
    assert built["decoding(knorm)"].target(100, 0.75) == n_kept(100, 0.75) == 25
    assert built["knorm"].target(100, 0.75) is None and REGISTRY["lowrank"].target(100, 0.75) is None
