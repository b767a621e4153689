"""`lowrank` against numpy: ranks shared by the spectrum at the ratio's budget, each row replaced by
μ + P Pᵀ (x − μ), from calibration statistics or the context's own."""

from __future__ import annotations

import numpy as np
import torch

from spectra.kv.presses.lowrank import LowRank, allocate

from .conftest import make_prefill


def eig(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean (d,), descending eigenvalues (d,) and eigenvectors (d, d) of one head's rows (N, d)."""
    values, vectors = np.linalg.eigh(np.cov(rows, rowvar=False, bias=True))
    return rows.mean(0), values[::-1], vectors[:, ::-1]


def numpy_lowrank(keys: np.ndarray, values: np.ndarray, ratio: float, fit_keys=None, fit_values=None):
    fits = [[eig(x) for x in (fit_keys if fit_keys is not None else keys)],
            [eig(x) for x in (fit_values if fit_values is not None else values)]]
    d, heads = keys.shape[-1], keys.shape[0]
    budget = round((1 - ratio) * 2 * d * heads)
    shares = [(fits[t][h][1][i] / fits[t][h][1].sum(), t, h, i) for t in range(2) for h in range(heads)
              for i in range(d)]
    chosen = sorted(range(len(shares)), key=lambda j: (-shares[j][0], j))[:budget]
    ranks = np.zeros((2, heads), int)
    for j in chosen:
        ranks[shares[j][1], shares[j][2]] += 1
    out = []
    for t, rows in enumerate((keys, values)):
        rebuilt = []
        for h in range(heads):
            mean, _, vectors = fits[t][h]
            p = vectors[:, : ranks[t, h]]
            rebuilt.append(mean + (rows[h] - mean) @ p @ p.T)
        out.append(np.stack(rebuilt))
    return out, ranks, 1 - budget / (2 * d * heads)


def test_allocation_takes_the_largest_relative_eigenvalues() -> None:
    values = torch.tensor([[[9.0, 1.0, 0.0], [1.0, 1.0, 1.0]], [[5.0, 5.0, 0.0], [3.0, 0.0, 0.0]]])
    assert allocate(values, 3).tolist() == [[1, 0], [1, 1]]
    assert allocate(values, 6).tolist() == [[1, 2], [2, 1]]  # 1, .9, .5, .5, then two of the thirds
    assert allocate(values, 12).tolist() == [[3, 3], [3, 3]]


def test_uncalibrated_lowrank_rebuilds_each_head_from_its_own_spectrum() -> None:
    prefill, arrays = make_prefill(length=40)
    got = LowRank().compress(prefill, 0.6)
    (keys, values), ranks, saved = numpy_lowrank(arrays["k"], arrays["v"], 0.6)
    np.testing.assert_allclose(got.key.numpy(), keys, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(got.value.numpy(), values, rtol=1e-9, atol=1e-10)
    assert got.saved == saved and got.kept.shape == (2, 40)
    assert ranks.sum() == round(0.4 * 32) and len(set(ranks.ravel())) > 1, "ranks differ by the spectrum"


def test_calibrated_lowrank_projects_on_the_calibration_basis() -> None:
    press = LowRank()
    calibration = [make_prefill(length=30, seed=seed)[0] for seed in (1, 2, 3)]
    for prefill in calibration:
        press.calibrate(prefill)
    prefill, arrays = make_prefill(length=40)
    got = press.compress(prefill, 0.25)
    fit_keys = np.concatenate([c.key.numpy() for c in calibration], axis=1)
    fit_values = np.concatenate([c.value.numpy() for c in calibration], axis=1)
    (keys, values), _, _ = numpy_lowrank(arrays["k"], arrays["v"], 0.25, fit_keys, fit_values)
    np.testing.assert_allclose(got.key.numpy(), keys, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(got.value.numpy(), values, rtol=1e-9, atol=1e-10)
    press.clear()
    own = press.compress(prefill, 0.25)
    assert not np.allclose(own.key.numpy(), got.key.numpy())


def test_no_compression_at_full_budget_and_the_mean_at_none() -> None:
    prefill, arrays = make_prefill(length=40)
    press = LowRank()
    np.testing.assert_allclose(press.compress(prefill, 0.0).key.numpy(), arrays["k"], atol=1e-10)
    nearly_all = press.compress(prefill, 0.99)  # round(0.01·32) = 0 directions: every row is its head's mean
    np.testing.assert_allclose(nearly_all.value.numpy(), np.broadcast_to(arrays["v"].mean(1, keepdims=True),
                                                                         arrays["v"].shape), atol=1e-12)


def test_lowrank_stores_its_coefficients_and_an_uncalibrated_basis() -> None:
    prefill, arrays = make_prefill(length=40)  # float64, d = 8
    _, ranks, _ = numpy_lowrank(arrays["k"], arrays["v"], 0.6)
    own = LowRank().compress(prefill, 0.6).memory(prefill).numpy()
    # per head: (r_K + r_V) coefficients per token, and each tensor's r directions of d numbers and its mean
    np.testing.assert_array_equal(own, (ranks.sum(0) * 40 + ranks.sum(0) * 8 + 2 * 8) * 8)
    press = LowRank()
    for seed in (1, 2):
        press.calibrate(make_prefill(length=30, seed=seed)[0])
    calibrated = press.compress(prefill, 0.6)
    fit = [np.concatenate([make_prefill(length=30, seed=seed)[1][name] for seed in (1, 2)], axis=1)
           for name in ("k", "v")]
    _, ranks, _ = numpy_lowrank(arrays["k"], arrays["v"], 0.6, *fit)
    np.testing.assert_array_equal(calibrated.memory(prefill).numpy(), ranks.sum(0) * 40 * 8)
