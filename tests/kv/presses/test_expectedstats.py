"""`expected_attention_stats(DIR)` against numpy: kvpress 0.5.5's ExpectedAttentionStatsPress score — the stored
query mean and covariance of each head rotated by RoPE's mean rotation over the next 512 positions (built here from
its 2 × 2 blocks), the softmax of the expected logits, the group mean, the value norm and the sinks — on random
tensors; the rows it keeps; the statistics it refuses."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv import artifacts
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.expected import FUTURE, SINKS

from .conftest import DIM, HEADS, KV_HEADS, make_prefill
from .test_expected import rope, rotation

LAYERS = 2


def numpy_stats_scores(mu: np.ndarray, sigma: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(H_kv, L): per key/value head the mean over its query heads of softmax_j(k_j·R̄μ_h/√d + k_jᵀR̄Σ_hR̄ᵀk_j/(2d))
    over the keys after the sinks, times ‖v_j‖; sinks scored max + 1; R̄ the mean rotation over L … L + 511."""
    length = keys.shape[1]
    groups = HEADS // keys.shape[0]
    turn = np.mean([rotation(p) for p in range(length, length + FUTURE)], axis=0)
    scores = np.zeros((keys.shape[0], length - SINKS))
    for h in range(HEADS):
        m, s = turn @ mu[h], turn @ sigma[h] @ turn.T
        k = keys[h // groups, SINKS:]
        z = k @ m / math.sqrt(DIM) + np.einsum("jd,de,je->j", k, s, k) / (2 * DIM)
        weights = np.exp(z - z.max())
        scores[h // groups] += weights / weights.sum() / groups
    scores *= np.linalg.norm(values[:, SINKS:], axis=-1)
    return np.concatenate([np.full((keys.shape[0], SINKS), scores.max() + 1), scores], axis=-1)


def statistics(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal((LAYERS, HEADS, DIM)) * 0.5
    factor = rng.standard_normal((LAYERS, HEADS, DIM, DIM)) * 0.3
    return mean, factor @ factor.transpose(0, 1, 3, 2)


def write_statistics(folder, mean: np.ndarray, covariance: np.ndarray):
    return artifacts.write(folder, {"query_mean": torch.from_numpy(mean).float(),
                                    "query_cov": torch.from_numpy(covariance).float()},
                           {"num_layers": mean.shape[0], "num_heads": mean.shape[1], "head_dim": mean.shape[2],
                            "dataset_name": "test", "model_name": "test", "num_samples": 1, "sample_seq_len": 1,
                            "n_sink": SINKS})


def test_scores_are_the_expected_attention_of_the_stored_query_distribution(tmp_path) -> None:
    mean, covariance = statistics()
    press = REGISTRY["expected_attention_stats"].bind(str(write_statistics(tmp_path / "st", mean, covariance)))
    assert press.peer == "ExpectedAttentionStatsPress" and press.needs_rope and not press.reads
    stored = mean.astype(np.float32).astype(np.float64), covariance.astype(np.float32).astype(np.float64)
    for layer in range(LAYERS):
        prefill, arrays = make_prefill(length=70, seed=layer + 5)
        prefill = dataclasses.replace(prefill, layer=layer, rope=rope)
        expected = numpy_stats_scores(stored[0][layer], stored[1][layer], arrays["k"], arrays["v"])
        got = press.score(prefill, 0.5)
        assert got.dtype == torch.float64 and got.shape == (KV_HEADS, 70)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-14)
        for ratio in (0.25, 0.5, 0.9):
            kept = press.compress(prefill, ratio).kept
            order = np.sort(np.argsort(-expected, axis=-1, kind="stable")[:, :n_kept(70, ratio)], axis=-1)
            np.testing.assert_array_equal(kept.numpy(), order)
            assert (kept[:, :SINKS] == torch.arange(SINKS)).all(), "the sinks are always kept"


def test_the_context_queries_play_no_part(tmp_path) -> None:
    """Unlike expected_attention, the press reads no query of the context: other queries, the same scores."""
    mean, covariance = statistics(1)
    press = REGISTRY["expected_attention_stats"].bind(str(write_statistics(tmp_path / "st", mean, covariance)))
    prefill, _ = make_prefill(length=40)
    prefill = dataclasses.replace(prefill, rope=rope)
    other = dataclasses.replace(prefill, q=torch.randn_like(prefill.q), passes={"query_pre": torch.randn(HEADS, 40, DIM)})
    torch.testing.assert_close(press.score(prefill, 0.5), press.score(other, 0.5), rtol=0, atol=0)


def test_statistics_of_another_shape_are_refused(tmp_path) -> None:
    mean, covariance = statistics()
    folder = write_statistics(tmp_path / "st", mean[:, :3], covariance[:, :3])
    prefill, _ = make_prefill()
    prefill = dataclasses.replace(prefill, rope=rope)
    with pytest.raises(SpectraError, match="3 heads"):
        REGISTRY["expected_attention_stats"].bind(str(folder)).score(prefill, 0.5)
    short = dataclasses.replace(make_prefill(length=SINKS)[0], rope=rope)
    full = write_statistics(tmp_path / "ok", mean, covariance)
    with pytest.raises(ValueError, match=f"more than {SINKS} context tokens"):
        REGISTRY["expected_attention_stats"].bind(str(full)).score(short, 0.5)
    with pytest.raises(SpectraError, match="query_cov"):
        artifacts.write(tmp_path / "half", {"query_mean": torch.zeros(1, 2, 3)},
                        {"num_layers": 1, "num_heads": 2, "head_dim": 3})
        REGISTRY.resolve(f"expected_attention_stats({tmp_path / 'half'})")
