"""`expected_attention` against numpy: the expected attention of future queries (kvpress 0.5.5's
ExpectedAttentionPress score at its defaults) — RoPE's rotations built here from their 2 × 2 blocks, the query
statistics, the softmax, the group mean, the value norm and the sinks — on random tensors; the rows it keeps; and
the prefills it refuses."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.expected import FUTURE, SINKS, expected_scores, mean_rotation

from .conftest import DIM, HEADS, KV_HEADS, make_prefill

BASE = 10000.0


def frequencies(dim: int = DIM) -> np.ndarray:
    """RoPE's angular frequencies θ_i = BASE^(−2i/d), i < d/2 (pair i rotates channels i and i + d/2)."""
    return BASE ** (-np.arange(0, dim, 2) / dim)


def rope(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) (n, d) a Llama-style rotary embedding gives at `positions`, in float64."""
    angles = positions.double()[:, None] * torch.from_numpy(frequencies())[None]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotation(position: int, dim: int = DIM) -> np.ndarray:
    """RoPE's (d, d) rotation at `position`: channel pair (i, i + d/2) turned by position·θ_i."""
    matrix = np.zeros((dim, dim))
    half = dim // 2
    for i, theta in enumerate(frequencies(dim)):
        c, s = math.cos(position * theta), math.sin(position * theta)
        matrix[i, i], matrix[i, i + half] = c, -s
        matrix[i + half, i], matrix[i + half, i + half] = s, c
    return matrix


def numpy_expected(q_pre: np.ndarray, keys: np.ndarray, values: np.ndarray, future: int = FUTURE,
                   sinks: int = SINKS, epsilon: float = 0.0, use_vnorm: bool = True) -> np.ndarray:
    """(H_kv, L) per key/value head: the mean over its query heads of softmax_j(k_j·R̄μ/√d + k_jᵀR̄ΣR̄ᵀk_j/(2d)) over
    the keys after the sinks, times ‖v_j‖; the sinks scored the maximum + 1. μ, Σ: mean and covariance (divided by
    the count) of each head's pre-RoPE queries after the sinks; R̄ the mean rotation over the next `future`
    positions."""
    heads, length, dim = q_pre.shape
    groups = heads // keys.shape[0]
    mean_rotation_ = np.mean([rotation(p, dim) for p in range(length, length + future)], axis=0)
    scores = np.zeros((keys.shape[0], length - sinks))
    for h in range(heads):
        queries = q_pre[h, sinks:]
        mu = queries.mean(axis=0)
        sigma = (queries - mu).T @ (queries - mu) / len(queries)
        mu, sigma = mean_rotation_ @ mu, mean_rotation_ @ sigma @ mean_rotation_.T
        k = keys[h // groups, sinks:]
        z = k @ mu / math.sqrt(dim) + np.einsum("jd,de,je->j", k, sigma, k) / (2 * dim)
        weights = np.exp(z - z.max())
        scores[h // groups] += weights / weights.sum() / groups
    if use_vnorm:  # kvpress adds ε only where it weighs by the value norm
        scores = (scores + epsilon) * np.linalg.norm(values[:, sinks:], axis=-1)
    return np.concatenate([np.full((keys.shape[0], sinks), scores.max() + 1), scores], axis=-1)


def with_queries(length: int = 100, seed: int = 0):
    """A random prefill (conftest's) with random pre-RoPE queries of every position and the float64 rope."""
    prefill, arrays = make_prefill(length=length, seed=seed)
    q_pre = np.random.default_rng(seed + 100).standard_normal((HEADS, length, DIM)) * 0.7 + 0.3
    return (dataclasses.replace(prefill, passes={**prefill.passes, "query_pre": torch.from_numpy(q_pre)}, rope=rope),
            {**arrays, "q_pre": q_pre})


def test_the_mean_rotation_is_the_mean_of_ropes_rotation_matrices() -> None:
    cos, sin = rope(torch.arange(37, 37 + 20))
    expected = np.mean([rotation(p) for p in range(37, 57)], axis=0)
    np.testing.assert_allclose(mean_rotation(cos, sin).numpy(), expected, rtol=0, atol=1e-13)
    x = np.random.default_rng(1).standard_normal(DIM)  # one rotation: q·cos + rotate_half(q)·sin
    cos, sin = rope(torch.tensor([5]))
    turned = x * cos[0].numpy() + np.concatenate([-x[DIM // 2:], x[:DIM // 2]]) * sin[0].numpy()
    np.testing.assert_allclose(mean_rotation(cos, sin).numpy() @ x, turned, atol=1e-13)
    np.testing.assert_allclose(rotation(5) @ x, turned, atol=1e-13)


def test_scores_equal_the_expected_attention_of_future_queries() -> None:
    prefill, arrays = with_queries()
    got = expected_scores(prefill)
    assert got.dtype == torch.float64 and got.shape == (KV_HEADS, 100)
    np.testing.assert_allclose(got.numpy(), numpy_expected(arrays["q_pre"], arrays["k"], arrays["v"]),
                               rtol=1e-10, atol=1e-14)
    single = dataclasses.replace(prefill, passes={"query_pre": prefill.read("query_pre").float()}, key=prefill.key.float(),
                                 value=prefill.value.float(), rope=lambda p: tuple(t.float() for t in rope(p)))
    assert expected_scores(single).dtype == torch.float32, "scored in the cache's dtype, as kvpress scores it"
    np.testing.assert_allclose(expected_scores(single).numpy(), got.numpy(), rtol=1e-4, atol=0)


def test_each_term_counts() -> None:
    """The covariance term and the rotation both change the scores (a press ignoring either would differ)."""
    prefill, arrays = with_queries(seed=3)
    full = numpy_expected(arrays["q_pre"], arrays["k"], arrays["v"])
    np.testing.assert_allclose(expected_scores(prefill).numpy(), full, rtol=1e-10)
    flat = numpy_expected(arrays["q_pre"], arrays["k"], arrays["v"], future=1)
    np.testing.assert_allclose(expected_scores(prefill, future=1).numpy(), flat, rtol=1e-10)
    assert not np.allclose(flat, full, rtol=1e-3)
    centred = arrays["q_pre"] - arrays["q_pre"][:, SINKS:].mean(axis=1, keepdims=True)  # μ = 0: covariance only
    only_covariance = dataclasses.replace(prefill, passes={"query_pre": torch.from_numpy(centred)})
    np.testing.assert_allclose(expected_scores(only_covariance).numpy(),
                               numpy_expected(centred, arrays["k"], arrays["v"]), rtol=1e-10)
    assert not np.allclose(expected_scores(only_covariance)[:, SINKS:].numpy(), 0)


def test_the_press_keeps_the_sinks_and_the_best_expected_keys_per_head() -> None:
    prefill, arrays = with_queries(length=90, seed=6)
    press = REGISTRY["expected_attention"]
    assert press.needs_rope and press.reads == ("query_pre",) and press.scorer
    reference = numpy_expected(arrays["q_pre"], arrays["k"], arrays["v"])
    for ratio in (0.25, 0.5, 0.9):
        keep = n_kept(90, ratio)
        kept = press.compress(prefill, ratio).kept
        expected = np.sort(np.argsort(-reference, axis=-1, kind="stable")[:, :keep], axis=-1)
        np.testing.assert_array_equal(kept.numpy(), expected)
        assert (kept[:, :SINKS] == torch.arange(SINKS)).all(), "the sinks are always kept"
    assert not torch.equal(press.compress(prefill, 0.5).kept[0], press.compress(prefill, 0.5).kept[1])


def test_a_prefill_without_what_it_reads_is_refused() -> None:
    prefill, _ = with_queries(length=SINKS)
    with pytest.raises(ValueError, match=f"more than {SINKS} context tokens"):
        expected_scores(prefill)
    least = REGISTRY["expected_attention"].min_context  # `spectra cache --context` is checked against it
    assert least == SINKS + 1 and expected_scores(with_queries(length=least)[0]).shape == (KV_HEADS, least)
    bare, _ = make_prefill()
    with pytest.raises(ValueError, match="lacks 'query_pre' \\(the context's queries before RoPE"):
        REGISTRY["expected_attention"].compress(bare, 0.5)


@pytest.mark.parametrize("epsilon, use_vnorm", [(0.01, True), (0.02, True), (0.0, False), (0.01, False)])
def test_the_settings_are_kvpress_keyword_arguments(epsilon, use_vnorm) -> None:
    """ExpectedAttentionPress(epsilon=…, use_vnorm=…) as kvpress's evaluation registry configures it: the press
    configured with those fields keeps what the numpy formula ranks first; the registered press is unchanged."""
    from spectra.kv.presses.fields import configured

    prefill, arrays = with_queries(length=90, seed=8)
    press = configured(REGISTRY["expected_attention"], epsilon=epsilon, use_vnorm=use_vnorm)
    reference = numpy_expected(arrays["q_pre"], arrays["k"], arrays["v"], epsilon=epsilon, use_vnorm=use_vnorm)
    np.testing.assert_allclose(press.score(prefill, 0.5).numpy(), reference, rtol=1e-10, atol=1e-14)
    default = numpy_expected(arrays["q_pre"], arrays["k"], arrays["v"])
    assert not np.allclose(reference, default, rtol=1e-6), "each setting changes the scores"
    keep = n_kept(90, 0.5)
    expected = np.sort(np.argsort(-reference, axis=-1, kind="stable")[:, :keep], axis=-1)
    np.testing.assert_array_equal(press.compress(prefill, 0.5).kept.numpy(), expected)
    assert (REGISTRY["expected_attention"].epsilon, REGISTRY["expected_attention"].use_vnorm) == (0.0, True)
    np.testing.assert_allclose(REGISTRY["expected_attention"].score(prefill, 0.5).numpy(), default, rtol=1e-10)
