"""kvpress's CAMPress (`cam(<decodable>)`): a compression keeps, merges and prunes what a numpy transcription of
kvpress's score → select → merge → prune keeps (the Bernoulli draws taken from the same seeded generator, on the
probabilities numpy computes); the running attention equals numpy's softmax over the cache averaged per key/value
head, one pass of n teacher-forced steps the same as n single steps; a stream of decoding steps through
`generation.Recompression` follows a numpy simulation of kvpress's forward hook step for step; bad input is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv import generation
from spectra.kv.presses import REGISTRY, run_presses
from spectra.kv.presses.cam import Cam, accumulate
from spectra.kv.presses.decoding import DecodingPress
from spectra.registry import PRESSES, press_names

from .conftest import DIM, HEADS, KV_HEADS

SCALING = DIM ** -0.5


def reference(keys: np.ndarray, values: np.ndarray, attention: np.ndarray, steps: int, target: int, budget: int,
              generator: torch.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """kvpress's CAMPress.compress over KnormPress (score −‖k‖), in numpy: the rows kept (sorted), their merged
    values, the running attention at them, and the merge probabilities (H_kv, merged)."""
    rows = keys.shape[1]
    mean = (-np.linalg.norm(keys, axis=-1)).mean(0)
    rising = np.argsort(mean, kind="stable")
    evicted, kept = np.sort(rising[:rows - target]), np.sort(rising[rows - target:])
    merging = np.sort(evicted[np.argsort(-mean[evicted], kind="stable")[:steps]])  # random keys: no ties
    windows = [kept[kept > row][:budget] for row in merging]
    probability = np.zeros((keys.shape[0], len(merging)))
    with np.errstate(divide="ignore", invalid="ignore"):
        for j, (row, window) in enumerate(zip(merging, windows)):
            around = attention[:, window].mean(-1) if len(window) else np.zeros(keys.shape[0])
            probability[:, j] = attention[:, row] / around
    probability = np.clip(np.where(np.isnan(probability), 0.0, np.where(np.isinf(probability), 1.0, probability)),
                          0, 1)
    drawn = torch.bernoulli(torch.from_numpy(probability), generator=generator).numpy()
    merged = values.copy()
    for j, (row, window) in enumerate(zip(merging, windows)):
        for head in range(keys.shape[0]):
            if drawn[head, j] and len(window):
                merged[head, window] += values[head, row] / len(window)
    return kept, merged[:, kept], attention[:, kept], probability


def random_cache(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((KV_HEADS, rows, DIM)) * rng.uniform(0.5, 2.0, (KV_HEADS, rows, 1))
    values = rng.standard_normal((KV_HEADS, rows, DIM))
    attention = rng.uniform(0.0, 3.0, (KV_HEADS, rows))
    return keys, values, attention


@pytest.mark.parametrize("rows,target,steps,budget", [(60, 30, 5, 32), (60, 45, 40, 4), (50, 10, 12, 32)])
def test_a_compression_keeps_and_merges_what_kvpress_does(rows, target, steps, budget) -> None:
    keys, values, attention = random_cache(rows, rows + target)
    attention[:, -12:] = 0.0  # windows of zero attention: 0/0 → 0 and x/0 → 1
    attention[0, -20] = 0.0
    press = run_presses(["cam(knorm)"])["cam(knorm)"]
    press.merge_budget = budget
    q = torch.zeros(HEADS, 1, DIM, dtype=torch.float64)
    got = press.merge_keep(0, q, torch.from_numpy(keys), torch.from_numpy(values), SCALING, target,
                           torch.from_numpy(attention), steps, torch.Generator().manual_seed(11))
    kept, merged, pruned, probability = reference(keys, values, attention, steps, target, budget,
                                                  torch.Generator().manual_seed(11))
    np.testing.assert_array_equal(got[0].numpy(), np.tile(kept, (KV_HEADS, 1)))
    np.testing.assert_allclose(got[1].numpy(), merged, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got[2].numpy(), pruned)
    assert 0 < probability.mean() < 1 and (probability == 0).any() and (probability == 1).any()
    assert not np.allclose(merged, values[:, kept]), "nothing merged"
    assert press.merge_keep(0, q, torch.from_numpy(keys), torch.from_numpy(values), SCALING, rows,
                            torch.from_numpy(attention), steps, torch.Generator()) is None  # nothing to drop


def softmax_attention(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The last query's attention (H_kv, M) over every row of keys, per query head, averaged over each group."""
    group = q.shape[0] // keys.shape[0]
    scores = np.einsum("hd,hmd->hm", q, np.repeat(keys, group, axis=0)) * SCALING
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return weights.reshape(keys.shape[0], group, -1).mean(1)


def test_the_running_attention_adds_each_steps_softmax_and_a_pass_equals_its_steps() -> None:
    rng = np.random.default_rng(4)
    context, n = 20, 6
    keys = rng.standard_normal((KV_HEADS, context + n, DIM))
    q = rng.standard_normal((HEADS, n, DIM))
    want = np.zeros((KV_HEADS, context + n))
    stepped = None
    for step in range(n):
        seen = context + step + 1
        want[:, :seen] += softmax_attention(q[:, step], keys[:, :seen])
        stepped = accumulate(stepped, torch.from_numpy(q[:, step:step + 1]), torch.from_numpy(keys[:, :seen]),
                             SCALING, every=False)
    np.testing.assert_allclose(stepped.numpy(), want, rtol=1e-12, atol=0)
    passed = accumulate(None, torch.from_numpy(q), torch.from_numpy(keys), SCALING, every=True)
    np.testing.assert_allclose(passed.numpy(), want, rtol=1e-12, atol=0)
    question = accumulate(None, torch.from_numpy(q), torch.from_numpy(keys), SCALING, every=False)  # one step:
    np.testing.assert_allclose(question.numpy(), softmax_attention(q[:, -1], keys), rtol=1e-12)  # its last query


@pytest.mark.parametrize("interval,ratio", [(4, 0.5), (7, 0.3)])
def test_a_stream_of_steps_follows_kvpress_hook(interval, ratio) -> None:
    context, total = 40, 75
    rng = np.random.default_rng(interval)
    keys = rng.standard_normal((KV_HEADS, total, DIM)) * rng.uniform(0.5, 2.0, (KV_HEADS, total, 1))
    values = rng.standard_normal((KV_HEADS, total, DIM))
    queries = rng.standard_normal((HEADS, total, DIM))
    press = REGISTRY["cam(knorm)"].for_run(compression_interval=interval)
    target = press.target(context, ratio)
    recompression = generation.Recompression(press, target, seed=3, index=8, ratio=ratio)
    cache = generation.Buffers([torch.zeros(KV_HEADS, total, DIM, dtype=torch.float64)],
                               [torch.zeros(KV_HEADS, total, DIM, dtype=torch.float64)], [0])
    cache.extend(0, torch.from_numpy(keys[:, :context]), torch.from_numpy(values[:, :context]))
    # kvpress's hook in numpy: the cache's keys, values, running attention; its draws from the seeded generator
    mine_keys, mine_values, running, count = keys[:, :context], values[:, :context], None, 0
    draws = torch.Generator().manual_seed(Cam.seed_of(3, 8))
    compressions = 0
    for position in range(context, total):
        mine_keys = np.concatenate([mine_keys, keys[:, position:position + 1]], axis=1)
        mine_values = np.concatenate([mine_values, values[:, position:position + 1]], axis=1)
        step = softmax_attention(queries[:, position], mine_keys)
        running = step if running is None else np.concatenate([running, np.zeros((KV_HEADS, 1))], axis=1) + step
        count += 1
        if count >= interval and mine_keys.shape[1] > target:
            kept, mine_values, running, _ = reference(mine_keys, mine_values, running, count, target, 32, draws)
            mine_keys, count, compressions = mine_keys[:, kept], 0, compressions + 1
        cache.extend(0, torch.from_numpy(keys[:, position:position + 1]),
                     torch.from_numpy(values[:, position:position + 1]))
        recompression.seen = position + 1
        recompression.after(0, cache, torch.from_numpy(queries[:, position:position + 1]), SCALING)
        got_keys, got_values = cache.rows(0)
        np.testing.assert_array_equal(got_keys.numpy(), mine_keys, err_msg=f"position {position}")
        np.testing.assert_allclose(got_values.numpy(), mine_values, rtol=0, atol=1e-12, err_msg=f"at {position}")
        np.testing.assert_allclose(recompression.attention[0].numpy(), running, rtol=1e-12, atol=1e-15)
    assert recompression.compressions == compressions >= 4


def test_the_registry_states_its_facts_and_a_run_sets_its_interval() -> None:
    built = run_presses(["cam(tova)"], compression_interval=9)["cam(tova)"]
    assert isinstance(built, Cam) and isinstance(built, DecodingPress) and built.interval == 9
    assert built.label == "cam(tova)" and built.wrapped.name == "tova" and type(built.fresh()) is Cam
    assert built.fresh().interval == 9 and REGISTRY["cam(knorm)"].interval == 512
    facts = dict(PRESSES.facts("cam(knorm)"))
    assert facts["peer"] == "CAMPress" and facts["decodes"] and facts["interval"] == 512
    assert built.target(256, 0.5) == 128 and built.merge_budget == 32
    assert Cam.seed_of(0, 1) != Cam.seed_of(0, 2)


def test_bad_input_is_refused() -> None:
    with pytest.raises(TypeError, match="cam wraps a decodable scorer press, not snapkv"):
        REGISTRY["cam"].bind(REGISTRY["snapkv"])
    for name, message in (("cam(snapkv)", "cam wraps a decodable press, and 'snapkv' is not one; decodables: "),
                          ("cam", "takes an argument: cam\\(<decodable>\\)$"),
                          ("cam(decoding(knorm))", "'decoding\\(knorm\\)' is not one")):
        with pytest.raises(SpectraError, match=message):
            press_names([name])
    with pytest.raises(ValueError, match="cam needs a scorer press"):
        REGISTRY["cam"].wrapped  # noqa: B018
