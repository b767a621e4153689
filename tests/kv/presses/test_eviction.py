"""Each eviction press keeps what kvpress 0.5.5 keeps: scores against numpy formulas written here, per key/value
head under grouped-query attention (6 query heads over 2 key/value heads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.eviction import KERNEL, SINKS, Random

from .conftest import make_prefill


def kept_of(name: str, ratio: float, length: int = 100, **options) -> tuple[np.ndarray, dict]:
    prefill, arrays = make_prefill(length=length, **options)
    compressed = REGISTRY[name].compress(prefill, ratio)
    return compressed.kept.numpy(), arrays


def top(scores: np.ndarray, count: int) -> np.ndarray:
    """Per row, the positions of the `count` largest scores, ascending."""
    return np.sort(np.argsort(-scores, axis=-1, kind="stable")[..., :count], axis=-1)


def group_mean(per_head: np.ndarray) -> np.ndarray:
    return per_head.reshape(2, 3, *per_head.shape[1:]).mean(1)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_streaming_keeps_the_sinks_and_the_most_recent_tokens(ratio: float) -> None:
    kept, _ = kept_of("streaming", ratio)
    count = n_kept(100, ratio)
    expected = np.r_[np.arange(SINKS), np.arange(100 - (count - SINKS), 100)]
    assert kept.shape == (2, count)
    np.testing.assert_array_equal(kept, np.stack([expected, expected]))


def test_knorm_keeps_the_smallest_key_norms_per_key_value_head() -> None:
    kept, arrays = kept_of("knorm", 0.5)
    np.testing.assert_array_equal(kept, top(-np.linalg.norm(arrays["k"], axis=-1), 50))
    assert not np.array_equal(kept[0], kept[1])


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_snapkv_pools_the_window_attention_and_keeps_the_window(ratio: float) -> None:
    length, window = 200, 64
    kept, arrays = kept_of("snapkv", ratio, length=length)
    p = arrays["p"][:, -window:, : length - window].mean(1)  # (H, L − w), not renormalised
    padded = np.pad(p, ((0, 0), (KERNEL // 2, KERNEL // 2)))
    pooled = np.stack([padded[:, j: j + KERNEL].sum(-1) / KERNEL for j in range(length - window)], axis=-1)
    scores = group_mean(pooled)
    count = n_kept(length, ratio)
    expected = np.concatenate([top(scores, count - window), np.tile(np.arange(length - window, length), (2, 1))],
                              axis=1)
    np.testing.assert_array_equal(kept, np.sort(expected, axis=-1))
    assert not np.array_equal(kept[0], kept[1])


def test_snapkv_keeps_only_window_tokens_when_fewer_than_the_window_are_kept() -> None:
    kept, _ = kept_of("snapkv", 0.5, length=120)  # 60 < 64 kept: part of the window, chosen by topk's tie order
    assert kept.shape == (2, 60) and (kept >= 120 - 64).all()


def test_snapkv_refuses_a_context_no_longer_than_its_window() -> None:
    prefill, _ = make_prefill(length=64)
    with pytest.raises(ValueError, match="snapkv needs more than 64 context tokens"):
        REGISTRY["snapkv"].compress(prefill, 0.5)


def test_tova_averages_the_last_query_over_all_heads_and_keeps_the_last_token() -> None:
    kept, arrays = kept_of("tova", 0.5)
    last = arrays["p"][:, -1, :-1].mean(0)
    expected = np.sort(np.r_[top(last[None], 49)[0], 99])
    np.testing.assert_array_equal(kept, np.stack([expected, expected]))


def test_observed_divides_the_received_attention_by_the_queries_that_see_each_key() -> None:
    kept, arrays = kept_of("observed", 0.75)
    received = arrays["p"].sum(1) / np.arange(100, 0, -1)
    np.testing.assert_array_equal(kept, top(group_mean(received), 25))


def test_random_draws_from_the_run_seed_and_sequence_index_alone() -> None:
    kept, _ = kept_of("random", 0.5, index=3)
    generator = torch.Generator().manual_seed(Random.seed_of(7, 3))
    scores = torch.rand(1, 2, 100, generator=generator, dtype=torch.float64)[0].numpy()
    np.testing.assert_array_equal(kept, top(scores, 50))
    again, _ = kept_of("random", 0.5, index=3, seed=5)  # other tensors, same sequence: the same draw
    other, _ = kept_of("random", 0.5, index=4)
    assert np.array_equal(kept, again) and not np.array_equal(kept, other)
