"""Streamed centred statistics against numpy on the pooled rows; ranks by energy; principal directions."""

from __future__ import annotations

import numpy as np
import torch

from spectra.kv.presses.pca import Fit, Moments, energy_rank, principal


def test_moments_pool_sequences_exactly_whatever_their_split() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((2, length, 5)) * [3.0, 1.0, 0.5, 0.2, 0.1] + 40.0 for length in (3, 11, 7)]
    moments = Moments()
    for part in parts:
        moments.add(4, "key", torch.from_numpy(part))
    fit = moments.fit(4, "key")
    pooled = np.concatenate(parts, axis=1)
    for head in range(2):
        np.testing.assert_allclose(fit.mean[head].numpy(), pooled[head].mean(0), rtol=1e-12)
        np.testing.assert_allclose(fit.covariance[head].numpy(), np.cov(pooled[head], rowvar=False, bias=True),
                                   rtol=1e-8, atol=1e-10)
    assert moments.has(4, "key") and not moments.has(3, "key") and not moments.has(4, "value")
    one = Fit.of(torch.from_numpy(pooled))
    torch.testing.assert_close(one.covariance, fit.covariance, rtol=1e-8, atol=1e-10)
    moments.clear()
    assert not moments.has(4, "key")


def test_eigen_and_principal_directions_against_numpy() -> None:
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((1, 200, 4)) @ np.diag([4.0, 2.0, 1.0, 0.1])
    fit = Fit.of(torch.from_numpy(rows))
    values, _ = fit.eigen()
    expected = np.linalg.eigvalsh(np.cov(rows[0], rowvar=False, bias=True))[::-1]
    np.testing.assert_allclose(values[0].numpy(), expected, rtol=1e-10)
    basis = principal(fit, 2)[0].numpy()
    assert basis.shape == (4, 2)
    np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-12)
    covariance = fit.covariance[0].numpy()
    np.testing.assert_allclose(covariance @ basis, basis * expected[:2], atol=1e-10)


def test_energy_rank_is_the_smallest_rank_reaching_the_share() -> None:
    values = torch.tensor([[8.0, 1.0, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert energy_rank(values, 0.9).tolist() == [2, 4, 4]  # no energy: every direction
    assert energy_rank(values, 0.8).tolist() == [1, 4, 4]


def test_moments_go_through_arrays_bitwise() -> None:
    rng = np.random.default_rng(1)
    moments = Moments()
    for layer, name in ((0, "key"), (0, "value"), (3, "key_pre")):
        moments.add(layer, name, torch.from_numpy(rng.standard_normal((2, 9, 4))))
    arrays = {key: np.array(value) for key, value in moments.arrays().items()}  # what a checkpoint stores
    assert sorted(arrays) == sorted(f"{layer}|{name}|{part}" for layer, name in ((0, "key"), (0, "value"),
                                                                               (3, "key_pre"))
                                    for part in ("sum", "second", "count"))
    restored = Moments()
    restored.load(arrays)
    assert set(restored.sums) == set(moments.sums)
    for key, (total, second, count) in moments.sums.items():
        again = restored.sums[key]
        assert torch.equal(again[0], total) and torch.equal(again[1], second) and again[2] == count == 9
    more = torch.from_numpy(rng.standard_normal((2, 5, 4)))
    moments.add(0, "key", more)
    restored.add(0, "key", more)
    assert torch.equal(moments.fit(0, "key").covariance, restored.fit(0, "key").covariance)
