"""`compactor` against numpy: kvpress 0.5.5's CompactorPress score at its defaults — the sketched ridge leverage of the
centred pre-RoPE keys, the non-causal chunked attention (its padded last chunk included), each z-scored, blended by
the ratio, the sinks kept — on random tensors; its sketches equal what torch's global generator draws layer by layer
once seeded (leverage's: test_leverage.py); the rows it keeps; the prefills it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.compactor import CHUNK, SINKS_END, SINKS_START, chunked_attention, compactor_scores
from spectra.kv.presses.leverage import SKETCH, Leverage, sketched_leverage, sketches

from .conftest import DIM, KV_HEADS
from .test_expected import rope, with_queries
from .test_leverage import numpy_leverage, z


def numpy_chunked(q: np.ndarray, k: np.ndarray, chunk: int) -> np.ndarray:
    """Per head, each chunk of `chunk` positions (the last padded with zero rows to `chunk`): the column sums of
    softmax over the chunk's keys of q·k, where a padded query's logits are 0 and a padded key's −1e-9."""
    heads, length, _ = q.shape
    out = np.zeros((heads, length))
    for start in range(0, length, chunk):
        real = min(chunk, length - start)
        logits = np.zeros((heads, chunk, chunk))
        logits[:, :real, :real] = np.einsum("hid,hjd->hij", q[:, start:start + real], k[:, start:start + real])
        if real < chunk:
            logits[:, :, real:] = -1e-9
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        out[:, start:start + real] = (weights / weights.sum(-1, keepdims=True)).sum(1)[:, :real]
    return out


def numpy_compactor(arrays: dict, blend: float, sketch: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """(H_kv, L) blend·z(leverage) + z(pooled attention × ‖v‖) between the sinks, the sinks the maximum."""
    q_pre, keys, values = arrays["q_pre"], arrays["k"], arrays["v"]
    length, groups = keys.shape[1], q_pre.shape[0] // keys.shape[0]
    inner = slice(SINKS_START, length - SINKS_END)
    cos, sin = (t.numpy() for t in rope(torch.arange(length)))
    half = DIM // 2
    q = q_pre * cos + np.concatenate([-q_pre[..., half:], q_pre[..., :half]], axis=-1) * sin  # post-RoPE queries
    attention = numpy_chunked(q[:, inner], np.repeat(keys[:, inner], groups, axis=0), chunk)
    attention = attention.reshape(KV_HEADS, groups, -1).mean(1) * np.linalg.norm(values[:, inner], axis=-1)
    padded = np.pad(attention, ((0, 0), (1, 1)))
    pooled = (padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]) / 3
    key_pre = arrays["k_pre"][:, inner]
    scores = blend * z(numpy_leverage(key_pre, sketch)) + z(pooled)
    return np.pad(scores, ((0, 0), (SINKS_START, SINKS_END)), constant_values=scores.max())


def with_keys_before_rope(length: int = 100, seed: int = 0):
    """`with_queries`' prefill, its pre-RoPE keys random too (the leverage reads them)."""
    import dataclasses

    prefill, arrays = with_queries(length, seed)
    k_pre = np.random.default_rng(seed + 200).standard_normal((KV_HEADS, length, DIM)) * [1.0] * DIM
    k_pre[..., 0] *= 5  # a direction the keys spread along
    return dataclasses.replace(prefill, key_pre=torch.from_numpy(k_pre)), {**arrays, "k_pre": k_pre}


def test_the_leverage_is_the_sketched_ridge_leverage_of_the_centred_keys() -> None:
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((2, 60, DIM)) * rng.uniform(0.1, 3.0, DIM) + 2.0
    sketch = rng.standard_normal((2, DIM, 5)) / np.sqrt(5)
    got = sketched_leverage(torch.from_numpy(keys), torch.from_numpy(sketch))
    assert got.dtype == torch.float32 and got.shape == (2, 60)
    np.testing.assert_allclose(got.numpy(), numpy_leverage(keys, sketch), rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("length, chunk", [(64, 16), (70, 16), (37, 256)])
def test_the_chunked_attention_is_non_causal_within_chunks_with_kvpress_padding(length, chunk) -> None:
    rng = np.random.default_rng(length)
    q, k = rng.standard_normal((4, length, DIM)), rng.standard_normal((4, length, DIM))
    got = chunked_attention(torch.from_numpy(q), torch.from_numpy(k), chunk)
    assert got.dtype == torch.float32 and got.shape == (4, length)
    np.testing.assert_allclose(got.numpy(), numpy_chunked(q, k, chunk), rtol=1e-5, atol=1e-6)
    if length % chunk == 0:  # whole chunks: each chunk's queries hand out one unit of attention each
        np.testing.assert_allclose(got.numpy().reshape(4, -1, chunk).sum(-1), chunk, rtol=1e-5)


@pytest.mark.parametrize("length, chunk", [(100, CHUNK), (100, 32)])
def test_scores_equal_the_blend_of_the_z_scored_leverage_and_attention(length, chunk) -> None:
    prefill, arrays = with_keys_before_rope(length)
    sketch = np.random.default_rng(9).standard_normal((KV_HEADS, DIM, SKETCH)) / np.sqrt(SKETCH)
    for blend in (0.25, 0.75):
        got = compactor_scores(prefill, blend, torch.from_numpy(sketch), chunk)
        assert got.shape == (KV_HEADS, length)
        np.testing.assert_allclose(got.numpy(), numpy_compactor(arrays, blend, sketch, chunk), rtol=1e-4, atol=1e-4)


def test_the_press_keeps_the_sinks_and_the_best_blended_tokens_per_head() -> None:
    prefill, arrays = with_keys_before_rope(90, seed=5)
    press = REGISTRY["compactor"]
    assert press.needs_rope and press.reads == ("query_pre",) and press.scorer
    seed = Leverage.seed_of(prefill.seed, prefill.index)  # leverage's sketches
    sketch = sketches(seed, prefill.layer, (1, KV_HEADS, DIM, SKETCH), torch.float64)[0].numpy()
    for ratio in (0.25, 0.5, 0.8):
        reference = numpy_compactor(arrays, ratio, sketch)
        kept = press.compress(prefill, ratio).kept
        expected = np.sort(np.argsort(-reference, axis=-1, kind="stable")[:, :n_kept(90, ratio)], axis=-1)
        np.testing.assert_array_equal(kept.numpy(), expected)
        assert (kept[:, :SINKS_START] == torch.arange(SINKS_START)).all() and (kept[:, -SINKS_END:] >= 86).all()


def test_a_prefill_without_what_it_reads_is_refused() -> None:
    short, _ = with_keys_before_rope(SINKS_START + SINKS_END)
    with pytest.raises(ValueError, match=f"more than {SINKS_START + SINKS_END} context tokens"):
        REGISTRY["compactor"].compress(short, 0.5)
    least = REGISTRY["compactor"].min_context  # what `spectra cache --context` is checked against before loading
    assert least == SINKS_START + SINKS_END + 1
    assert REGISTRY["compactor"].compress(with_keys_before_rope(least)[0], 0.5).kept.shape == (KV_HEADS, 6)
    bare, _ = with_queries()
    with pytest.raises(ValueError, match="compactor reads the pre-RoPE keys"):
        REGISTRY["compactor"].compress(bare, 0.5)
