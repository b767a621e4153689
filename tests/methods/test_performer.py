"""Performer (FAVOR+) against its formula written densely in numpy, its features' structure and statistics."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from layers import B, D, H, N, head, random_layer
from spectra.methods import REGISTRY, performer
from spectra.probes.approx import measures
from spectra.seeds import Domain, derive_seed

LENGTHS = (N, 7)
S = 0.7  # the score scale s


def layer(lengths=LENGTHS, n=N, seed=0, spread=1.0):
    """Padded float64 layer; P computed from q and k (as a substitution sees it)."""
    return random_layer(lengths, n=n, seed=seed, spread=spread, scaling=S, use_p=False)


def phi(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """φ(x) = exp(−‖x‖²/2)/√m · exp(W x), row-wise, without any stabilisation."""
    return np.exp(x @ w.T - (x * x).sum(-1, keepdims=True) / 2) / math.sqrt(w.shape[0])


def test_performer_is_favor_plus() -> None:
    x, budget = layer(), 6
    approx_ = REGISTRY["performer"].run(x, budget)
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            w = performer.orthogonal_features(budget, D, derive_seed(0, Domain.PERFORMER, budget, 3, h))
            q, k, v = head(x, b, h, m)
            phi_q, phi_k = phi(q * math.sqrt(S), w), phi(k * math.sqrt(S), w)
            p_tilde = (phi_q @ phi_k.T) / (phi_q @ phi_k.sum(0))[:, None]
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), p_tilde, atol=1e-12)
            assert np.allclose(approx_.p[b, h, :, m:].numpy(), 0), "padded keys have φ = 0"
            assert np.allclose(approx_.out[b, h, :m].numpy(), p_tilde @ v, atol=1e-12)


def test_orthogonal_features_structure() -> None:
    w = performer.orthogonal_features(10, D, seed=5)
    assert w.shape == (10, D)
    for block in (w[:4], w[4:8]):
        gram = block @ block.T
        assert np.allclose(gram, np.diag(np.diag(gram)), atol=1e-12), "rows of a block are orthogonal"
    # each row is marginally N(0, I): E‖w‖² = d and E w = 0, over many seeds
    rows = np.concatenate([performer.orthogonal_features(8, D, seed) for seed in range(500)])
    assert abs((rows ** 2).sum(1).mean() - D) < 4 * (rows ** 2).sum(1).std() / math.sqrt(len(rows))
    assert np.abs(rows.mean(0)).max() < 4 / math.sqrt(len(rows))


def test_performer_kernel_is_unbiased() -> None:
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=D) * 0.6, rng.normal(size=D) * 0.6
    root = math.sqrt(S)
    estimates = []
    for seed in range(4000):
        w = torch.from_numpy(performer.orthogonal_features(8, D, seed))[None]  # (1, m, d)
        feats = performer.log_features(torch.from_numpy(np.stack([q, k]) * root)[None, None], w).exp()[0, 0]
        estimates.append(float(feats[0] @ feats[1]))
    mean, error = np.mean(estimates), np.std(estimates) / math.sqrt(len(estimates))
    assert abs(mean - math.exp(S * q @ k)) < 4 * error and error < 0.02 * math.exp(S * q @ k)


def test_performer_converges_with_more_features() -> None:
    x = layer(spread=0.5)  # moderate norms: the estimator's variance grows like exp(‖x + y‖²)
    errors = {m: np.mean([measures(replace(x, seed=seed), REGISTRY["performer"].run(replace(x, seed=seed), m))[0].mean()
                          for seed in range(5)]) for m in (64, 4096)}
    assert errors[4096] < errors[64] / 3.5 and errors[4096] < 0.05, errors  # ~1/√m: a factor 8 at most


def test_performer_features_depend_on_budget_layer_head_seed() -> None:
    x = layer()
    w = performer.performer_features(x, 5)
    assert w.shape == (H, 5, D) and not torch.allclose(w[0], w[1])
    assert not torch.allclose(w[:, :4], performer.performer_features(x, 4))
    assert torch.equal(w, performer.performer_features(layer(seed=9), 5)), "W depends on the run seed, not the data"
