"""`lagkv` against numpy: kvpress 0.5.5's LagKVPress score (each partition's keys and values normalised by the next
partition's channel ranges, the std across channels softmaxed over the partition, ranked within it), written here
token by token, and the rows it keeps per key/value head."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.lagkv import LAG, SINKS, LagKV

from .conftest import make_prefill


def numpy_scores(k: np.ndarray, v: np.ndarray, sinks: int, lag: int) -> np.ndarray:
    """(H_kv, L) LagKV scores by loops over heads, partitions and tokens (float64)."""
    heads, length, _ = k.shape
    if length < sinks + 2 * lag:
        return np.r_[np.ones(min(sinks, length)), np.arange(max(length - sinks, 0)) / max(length - sinks, 1)][
            None].repeat(heads, 0)
    parts = (length - sinks) // lag
    scores = np.ones((heads, length))
    for h in range(heads):
        for i in range(parts - 1):
            start = sinks + i * lag
            mean = np.zeros(lag)
            for states in (k[h], v[h]):
                reference = states[start + lag: start + 2 * lag]
                low, high = reference.min(0), reference.max(0)
                spread = np.array([np.std((states[start + j] - low) / (high - low), ddof=1) for j in range(lag)])
                weights = np.exp(spread - spread.max())
                mean += weights / weights.sum() / 2
            ranks = np.empty(lag)
            ranks[np.argsort(mean)] = np.arange(lag)
            scores[h, start: start + lag] = ranks / lag
    return scores


def lagkv_prefill(length: int, seed: int = 0):
    """A random prefill in float32 (kvpress's dtype on the model), with its numpy keys and values."""
    prefill, arrays = make_prefill(length=length, seed=seed)
    single = dataclasses.replace(prefill, key=prefill.key.float(), value=prefill.value.float())
    return single, single.key.double().numpy(), single.value.double().numpy()


@pytest.mark.parametrize("length", [4 + 5 * 8, 4 + 5 * 8 + 3, 100])
def test_scores_equal_the_lag_relative_formula(length: int) -> None:
    prefill, k, v = lagkv_prefill(length)
    got = LagKV(sinks=4, lag=8).score(prefill, 0.5)
    assert got.dtype == torch.float32 and got.shape == (2, length)
    np.testing.assert_array_equal(got.double().numpy(), numpy_scores(k, v, 4, 8))
    parts = (length - 4) // 8
    assert (got[:, 4: 4 + (parts - 1) * 8] < 1).all(), "every scored token below the protected ones"
    assert (got[:, 4 + (parts - 1) * 8:] == 1).all() and (got[:, :4] == 1).all(), "sinks and the last partition"


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_it_keeps_the_sinks_the_tail_and_the_same_best_ranks_of_every_partition(ratio: float) -> None:
    # L = 4 + 6·8 + 4 = 56: four sinks, five scored partitions of 8, the last partition and 4 more (12, no reference);
    # the 26 (r = 0.25) or 12 (r = 0.5) scored tokens kept are the same best ranks of every partition, and the one or
    # two left over go, one each, to partitions torch.topk's tie order picks
    length, sinks, lag = 4 + 6 * 8 + 4, 4, 8
    prefill, k, v = lagkv_prefill(length, seed=1)
    count = n_kept(length, ratio)
    chosen = count - sinks - (lag + 4)
    kept = LagKV(sinks=sinks, lag=lag).compress(prefill, ratio).kept.numpy()
    scores = numpy_scores(k, v, sinks, lag)
    per_partition, extra = divmod(chosen, 5)
    for h in range(2):
        row = set(kept[h].tolist())
        assert set(range(sinks)) <= row and set(range(length - lag - 4, length)) <= row
        takes = []
        for i in range(5):
            start = sinks + i * lag
            ranks = np.rint(scores[h, start: start + lag] * lag).astype(int)
            mine = sorted(ranks[j] for j in range(lag) if start + j in row)
            takes.append(len(mine))
            assert mine == list(range(lag - len(mine), lag)), "a partition keeps its best ranks"
        assert sorted(takes) == [per_partition] * (5 - extra) + [per_partition + 1] * extra
    assert not np.array_equal(kept[0], kept[1])


def test_exact_kept_rows_when_the_budget_fills_whole_ranks() -> None:
    length = 4 + 6 * 8 + 4  # as above: 4 sinks, five scored partitions of 8, 12 always kept at the end
    prefill, k, v = lagkv_prefill(length, seed=2)
    ratio = 1 - (4 + 12 + 5 * 3) / length  # 31 kept: three best ranks of each of the five partitions
    assert n_kept(length, ratio) == 31
    kept = LagKV(sinks=4, lag=8).compress(prefill, ratio).kept.numpy()
    scores = numpy_scores(k, v, 4, 8)
    expected = np.sort(np.argsort(-scores, axis=-1, kind="stable")[:, :31], axis=-1)
    np.testing.assert_array_equal(kept, expected)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.98])
def test_a_short_context_keeps_the_sinks_and_the_most_recent(ratio: float) -> None:
    length = SINKS + 2 * LAG - 1  # one token short of two partitions: kvpress does not score it
    prefill, _, _ = lagkv_prefill(length)
    count = n_kept(length, ratio)
    kept = REGISTRY["lagkv"].compress(prefill, ratio).kept.numpy()
    if count >= SINKS:
        expected = np.r_[np.arange(SINKS), np.arange(length - (count - SINKS), length)]
        np.testing.assert_array_equal(kept, np.stack([expected, expected]))
    else:
        assert kept.shape == (2, count) and (kept < SINKS).all()


def test_the_registered_press_uses_kvpress_defaults() -> None:
    press = REGISTRY["lagkv"]
    assert isinstance(press, LagKV) and (press.sinks, press.lag) == (4, 128) == (SINKS, LAG)
    prefill, k, v = lagkv_prefill(SINKS + 3 * LAG + 7, seed=3)
    np.testing.assert_array_equal(press.score(prefill, 0.5).double().numpy(), numpy_scores(k, v, SINKS, LAG))
