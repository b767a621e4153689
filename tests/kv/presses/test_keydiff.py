"""`keydiff` against numpy: minus each cached key's cosine with the mean of its head's unit keys (kvpress 0.5.5's
KeyDiffPress score); which keys it keeps per key/value head."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.keydiff import keydiff_scores

from .conftest import make_prefill


def numpy_keydiff(keys: np.ndarray) -> np.ndarray:
    """(H_kv, L): −k_j·a / (‖k_j‖ ‖a‖) with a = mean_j k_j / ‖k_j‖, per head, in float64."""
    norms = np.sqrt(np.einsum("hld,hld->hl", keys, keys))
    anchor = (keys / norms[..., None]).mean(axis=1)  # (H_kv, d)
    return -np.einsum("hld,hd->hl", keys, anchor) / (norms * np.linalg.norm(anchor, axis=-1)[:, None])


def kept_by(scores: np.ndarray, keep: int) -> np.ndarray:
    """The `keep` highest-scoring positions of each row, in position order."""
    return np.sort(np.argsort(-scores, axis=-1, kind="stable")[:, :keep], axis=-1)


def test_scores_equal_the_cosine_with_the_mean_unit_key() -> None:
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((3, 70, 16)) * rng.uniform(0.1, 10.0, (3, 70, 1)) + rng.standard_normal((3, 1, 16))
    got = keydiff_scores(torch.from_numpy(keys))
    assert got.dtype == torch.float64 and got.shape == (3, 70)
    np.testing.assert_allclose(got.numpy(), numpy_keydiff(keys), rtol=1e-12, atol=1e-14)
    single = keydiff_scores(torch.from_numpy(keys).float())
    assert single.dtype == torch.float32, "scored in the cache's dtype, as kvpress scores it"
    np.testing.assert_allclose(single.numpy(), numpy_keydiff(keys), rtol=0, atol=1e-5)


def test_the_anchor_averages_directions_and_the_score_ignores_lengths() -> None:
    rng = np.random.default_rng(8)
    keys = rng.standard_normal((2, 40, 8)) + np.array([3.0] + [0.0] * 7)
    stretched = keys * rng.uniform(0.01, 100.0, (2, 40, 1))  # each key rescaled: its direction unchanged
    np.testing.assert_allclose(keydiff_scores(torch.from_numpy(stretched)).numpy(),
                               keydiff_scores(torch.from_numpy(keys)).numpy(), rtol=1e-10, atol=1e-12)
    raw_mean = keys.mean(axis=1)  # the anchor a mean of the keys themselves would give differs once lengths differ
    raw = -np.einsum("hld,hd->hl", stretched, raw_mean) / np.linalg.norm(stretched, axis=-1) \
        / np.linalg.norm(raw_mean, axis=-1)[:, None]
    assert not np.allclose(raw, numpy_keydiff(stretched), atol=1e-3)


def test_a_zero_key_scores_zero_not_nan() -> None:
    keys = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    scores = keydiff_scores(keys)
    assert torch.isfinite(scores).all() and scores[0, 1] == 0


def test_the_press_keeps_the_keys_least_aligned_with_the_anchor_per_head() -> None:
    prefill, arrays = make_prefill(length=90, seed=6)
    rng = np.random.default_rng(11)
    keys = arrays["k"] + np.array([[2.0] + [0.0] * 7, [0.0, -1.5] + [0.0] * 6])[:, None, :]
    keys[:, 17] = rng.standard_normal((2, 8)) * 0.1 - keys.mean(axis=1) * 3  # against the common direction
    prefill = dataclasses.replace(prefill, key=torch.from_numpy(keys))
    for ratio in (0.25, 0.5, 0.9):
        compressed = REGISTRY["keydiff"].compress(prefill, ratio)
        keep = n_kept(90, ratio)
        np.testing.assert_array_equal(compressed.kept.numpy(), kept_by(numpy_keydiff(keys), keep))
        assert compressed.saved == 1 - keep / 90
        assert (compressed.kept.numpy() == 17).any(axis=-1).all(), "the key opposite the common direction stays"
    kept = REGISTRY["keydiff"].compress(prefill, 0.5).kept.numpy()
    assert not np.array_equal(kept[0], kept[1]), "each key/value head keeps its own tokens"
    knorm = REGISTRY["knorm"].compress(prefill, 0.5).kept.numpy()
    assert not np.array_equal(kept, knorm)
    pre = REGISTRY["keydiff"].compress(dataclasses.replace(prefill, key_pre=torch.from_numpy(arrays["k"])), 0.5)
    np.testing.assert_array_equal(pre.kept.numpy(), kept, err_msg="the cached (post-RoPE) keys, as kvpress reads them")
