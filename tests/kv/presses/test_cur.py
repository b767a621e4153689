"""`cur` against numpy: the product of the keys' and the values' squared norms, each a share of its 16-token block,
normalised, sinks scored 1 (kvpress 0.5.5's CURPress score at its defaults), on random tensors; the rows it keeps."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.cur import SINKS, WINDOW, cur_scores, local_share

from .conftest import make_prefill


def numpy_local_share(energy: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Each entry over the sum of the entries in its block [window·⌊j/window⌋, window·⌊j/window⌋ + window) ∩ [0, L)."""
    out = np.empty_like(energy)
    for start in range(0, energy.shape[-1], window):
        block = energy[..., start:start + window]
        out[..., start:start + window] = block / block.sum(axis=-1, keepdims=True)
    return out


def numpy_cur(keys: np.ndarray, values: np.ndarray, sinks: int = SINKS) -> np.ndarray:
    """(H_kv, L): the local shares of ‖k_j‖² and ‖v_j‖² multiplied, over their sum; the first `sinks` set to 1."""
    product = numpy_local_share((keys ** 2).sum(-1)) * numpy_local_share((values ** 2).sum(-1))
    scores = product / product.sum(axis=-1, keepdims=True)
    scores[:, :sinks] = 1.0
    return scores


def test_local_shares_sum_to_one_in_every_block() -> None:
    energy = np.random.default_rng(2).uniform(0.1, 5.0, (3, 50))  # 50 = 3 blocks of 16 and one of 2
    got = local_share(torch.from_numpy(energy)).numpy()
    np.testing.assert_allclose(got, numpy_local_share(energy), rtol=1e-14)
    for start in range(0, 50, WINDOW):
        np.testing.assert_allclose(got[:, start:start + WINDOW].sum(-1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(local_share(torch.from_numpy(energy[:, :48])).numpy(), got[:, :48], rtol=1e-14)


def test_scores_equal_the_local_leverage_product() -> None:
    rng = np.random.default_rng(5)
    for length in (37, 64, 101):
        keys = rng.standard_normal((2, length, 8)) * rng.uniform(0.2, 3.0, (2, length, 1))
        values = rng.standard_normal((2, length, 8)) * rng.uniform(0.2, 3.0, (2, length, 1))
        got = cur_scores(torch.from_numpy(keys), torch.from_numpy(values))
        assert got.dtype == torch.float64 and got.shape == (2, length)
        np.testing.assert_allclose(got.numpy(), numpy_cur(keys, values), rtol=1e-12, atol=0)
        assert (got[:, :SINKS] == 1).all() and (got[:, SINKS:] < 1).all(), "the sinks above every other score"
    single = cur_scores(torch.from_numpy(keys).float(), torch.from_numpy(values).float())
    assert single.dtype == torch.float32, "scored in the cache's dtype, as kvpress scores it"
    np.testing.assert_allclose(single.numpy(), numpy_cur(keys, values), rtol=1e-5)


def test_the_press_keeps_the_sinks_and_the_best_local_leverages_per_head() -> None:
    prefill, arrays = make_prefill(length=90, seed=6)
    rng = np.random.default_rng(9)
    values = arrays["v"] * rng.uniform(0.1, 4.0, arrays["v"].shape[:2])[..., None]
    prefill = dataclasses.replace(prefill, value=torch.from_numpy(values))
    press = REGISTRY["cur"]
    reference = numpy_cur(arrays["k"], values)
    for ratio in (0.25, 0.5, 0.9):
        keep = n_kept(90, ratio)
        kept = press.compress(prefill, ratio).kept
        expected = np.sort(np.argsort(-reference, axis=-1, kind="stable")[:, :keep], axis=-1)
        np.testing.assert_array_equal(kept.numpy(), expected)
        assert (kept[:, :SINKS] == torch.arange(SINKS)).all(), "the sinks are always kept"
    by_keys = np.sort(np.argsort(-(arrays["k"] ** 2).sum(-1), axis=-1)[:, :45], axis=-1)
    assert not np.array_equal(press.compress(prefill, 0.5).kept.numpy(), by_keys), "values count, not keys alone"
