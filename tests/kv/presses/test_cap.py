"""`cap` against numpy: CAPKV's weighted leverage (kvpress 0.5.5's CapPress score at its defaults) — the query anchor
rotated by RoPE's mean future rotation built here from 2 × 2 blocks, the clamped cosine, the shifted exponential
weights, the capacity matrix inverted in float64, the group mean and the sinks — on random tensors; the rows it
keeps; and the prefills it refuses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.cap import EPSILON, FUTURE, SINKS, TAU, cap_scores
from spectra.registry import PRESSES, press_names

from .conftest import DIM, HEADS, make_prefill
from .test_expected import rope, rotation


def numpy_cap(q_pre: np.ndarray, keys: np.ndarray, values: np.ndarray, tau: float = TAU, future: int = FUTURE,
              sinks: int = SINKS, epsilon: float = EPSILON) -> np.ndarray:
    """(H_kv, L): per query head, w_j = exp(τ cos(k_j, R̄ μ) − max), s_j = w_j v_jᵀ (I + Σ_i (w_i + ε) v_i v_iᵀ)⁻¹ v_j
    over the tokens after the sinks (μ: the mean pre-RoPE query after the sinks, R̄ the mean rotation over the next
    `future` positions); the mean over each group; the sinks scored the maximum + 1."""
    heads, length, dim = q_pre.shape
    groups = heads // keys.shape[0]
    mean_rotation = np.mean([rotation(p, dim) for p in range(length, length + future)], axis=0)
    scores = np.zeros((keys.shape[0], length - sinks))
    for h in range(heads):
        anchor = mean_rotation @ q_pre[h, sinks:].mean(axis=0)
        k, v = keys[h // groups, sinks:], values[h // groups, sinks:]
        cosine = np.clip(k @ anchor / np.linalg.norm(k, axis=-1) / np.linalg.norm(anchor), -1, 1)
        weights = np.exp(tau * cosine - np.max(tau * cosine))
        capacity = np.eye(dim) + np.einsum("t,td,te->de", weights + epsilon, v, v)
        leverage = np.einsum("td,td->t", v, np.linalg.solve(capacity, v.T).T)
        scores[h // groups] += weights * leverage / groups
    return np.concatenate([np.full((keys.shape[0], sinks), scores.max() + 1), scores], axis=1)


def with_queries(length: int = 100, seed: int = 0) -> tuple:
    prefill, arrays = make_prefill(length=length, seed=seed)
    rng = np.random.default_rng(seed + 50)
    q_pre = rng.standard_normal((HEADS, length, DIM)) + rng.standard_normal((HEADS, 1, DIM))
    arrays["q_pre"] = q_pre
    found = dataclasses.replace(prefill, passes={**prefill.passes, "query_pre": torch.from_numpy(q_pre)}, rope=rope)
    return found, arrays


@pytest.mark.parametrize("length, seed", [(100, 0), (37, 3)])
def test_scores_equal_the_weighted_leverage(length, seed) -> None:
    prefill, arrays = with_queries(length, seed)
    got = cap_scores(prefill)
    assert got.shape == (2, length)
    np.testing.assert_allclose(got.numpy(), numpy_cap(arrays["q_pre"], arrays["k"], arrays["v"]), rtol=2e-5,
                               atol=1e-7)


def test_the_weights_favour_keys_aligned_with_the_anchor_and_leverage_rare_values() -> None:
    """With equal weights (every key the same), one value direction shared by many tokens has little leverage each,
    1/(1 + 55(1 + ε)); a token alone in its direction a lot, 1/(2 + ε); and a key turned around changes its weight."""
    prefill, arrays = with_queries(60, 1)
    keys = np.tile(arrays["k"][:, :1], (1, 60, 1))  # every key alike: every weight exp(0) = 1
    values = np.zeros((2, 60, DIM))
    values[:, :, 0] = 1.0  # every token writes along channel 0 …
    values[:, 30, :] = 0.0
    values[:, 30, 1] = 1.0  # … but token 30, alone along channel 1
    alike = dataclasses.replace(prefill, key=torch.from_numpy(keys), value=torch.from_numpy(values))
    scored = cap_scores(alike).numpy()
    np.testing.assert_allclose(scored[:, 30], 1 / (2 + EPSILON), rtol=1e-6)
    np.testing.assert_allclose(np.delete(scored[:, SINKS:], 30 - SINKS, axis=1), 1 / (1 + 55 * (1 + EPSILON)),
                               rtol=1e-6)
    keys[:, 10] = -keys[:, 10]  # a key turned around: its weight moves by exp(±2τ·cos), and the max shift with it
    turned = cap_scores(dataclasses.replace(alike, key=torch.from_numpy(keys))).numpy()
    assert not np.allclose(turned[:, 10], scored[:, 10], rtol=0.5)
    np.testing.assert_allclose(turned, numpy_cap(arrays["q_pre"], keys, values), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_the_press_keeps_the_sinks_and_the_top_scores(ratio) -> None:
    prefill, arrays = with_queries(120, 2)
    compressed = REGISTRY["cap"].compress(prefill, ratio)
    keep = n_kept(120, ratio)
    scores = numpy_cap(arrays["q_pre"], arrays["k"], arrays["v"])
    expected = np.sort(np.argsort(-scores, axis=-1, kind="stable")[:, :keep], axis=-1)
    np.testing.assert_array_equal(compressed.kept.numpy(), expected)
    assert set(range(SINKS)) <= set(compressed.kept[0].tolist())


def test_its_declaration_and_bad_prefills() -> None:
    facts = dict(PRESSES.facts("cap"))
    assert facts["reads"] == ("query_pre",) and facts["needs_rope"] and facts["min_context"] == 5 and facts["peer"] == "CapPress"
    prefill, _ = make_prefill(length=50)
    with pytest.raises(ValueError, match="lacks 'query_pre'"):
        cap_scores(prefill)
    short, _ = with_queries(4)
    with pytest.raises(ValueError, match="cap needs more than 4 context tokens, got 4"):
        cap_scores(short)
    with pytest.raises(SpectraError, match="press 'cap' takes no argument"):
        press_names(["cap(knorm)"])
