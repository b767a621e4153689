"""Performer (FAVOR+) against its formula written densely in numpy, its features' structure and statistics."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from layers import D, H, N, approximate, draws, head, random_layer
from spectra.methods import performer
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
    approx_ = approximate("performer", x, budget)
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            w = performer.orthogonal_features(budget, D, derive_seed(0, Domain.PERFORMER, budget, 3, h))
            q, k, v = head(x, b, h, m)
            phi_q, phi_k = phi(q * math.sqrt(S), w), phi(k * math.sqrt(S), w)
            p_tilde = (phi_q @ phi_k.T) / (phi_q @ phi_k.sum(0))[:, None]
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), p_tilde, atol=1e-12)
            assert np.allclose(approx_.p[b, h, :, m:].numpy(), 0), "padded keys have φ = 0"
            assert np.allclose(approx_.out[b, h, :m].numpy(), p_tilde @ v, atol=1e-12)


def test_favor_plus_with_the_seeded_draw_is_the_method() -> None:
    x, budget = layer(), 6
    want = approximate("performer", x, budget)
    got = performer.favor_plus(x.q, x.k, x.v, x.valid, x.scaling, performer.performer_features(x, budget, draws(x)))
    assert torch.equal(got.out, want.out) and torch.equal(got.p, want.p)


def test_favor_plus_with_given_features_is_the_dense_formula() -> None:
    x = layer()
    w = np.random.default_rng(3).standard_normal((H, 9, D))  # plain Gaussian features, not the seeded draw
    approx_ = performer.favor_plus(x.q, x.k, x.v, x.valid, S, torch.from_numpy(w).float())  # cast to q's dtype
    assert approx_.out.dtype == torch.float64
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            q, k, v = head(x, b, h, m)
            wh = torch.from_numpy(w[h]).float().double().numpy()
            phi_q, phi_k = phi(q * math.sqrt(S), wh), phi(k * math.sqrt(S), wh)
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
    errors = {m: np.mean([measures(x, approximate("performer", x, m, draws(x, seed=seed)))[0].mean()
                          for seed in range(5)]) for m in (64, 4096)}
    assert errors[4096] < errors[64] / 3.5 and errors[4096] < 0.05, errors  # ~1/√m: a factor 8 at most


def test_performer_features_depend_on_budget_layer_head_seed() -> None:
    x = layer()
    w = performer.performer_features(x, 5, draws(x))
    assert w.shape == (H, 5, D) and not torch.allclose(w[0], w[1])
    assert not torch.allclose(w[:, :4], performer.performer_features(x, 4, draws(x)))
    other = layer(seed=9)
    assert torch.equal(w, performer.performer_features(other, 5, draws(x))), "W depends on the run seed, not the data"
    assert not torch.allclose(w, performer.performer_features(x, 5, draws(x, seed=9)))


# ---------------------------------------------------------------- performer-causal

CAUSAL_KINDS = [("left", True), ("right", True)]


@pytest.mark.parametrize("side,causal", CAUSAL_KINDS)
def test_performer_causal_is_favor_plus_over_each_prefix(side, causal) -> None:
    from methods.causal_layers import allowed, layer as causal_layer, valid_rows

    x, budget = causal_layer(side=side, causal=causal), 6
    approx_ = approximate("performer-causal", x, budget)
    for b in range(2):
        rows = valid_rows(x, b)
        for h in range(H):
            w = performer.orthogonal_features(budget, D, derive_seed(0, Domain.PERFORMER, budget, 3, h))
            q, k, v = (t[b, h].numpy() for t in (x.q, x.k, x.v))
            phi_q, phi_k = phi(q * math.sqrt(S), w), phi(k * math.sqrt(S), w)
            p_tilde = np.zeros((N, N))
            for i in rows:
                seen = allowed(x, b, i)  # the valid keys at or before i
                p_tilde[i, seen] = phi_q[i] @ phi_k[seen].T / (phi_q[i] @ phi_k[seen].sum(0))
            assert np.allclose(approx_.p[b, h, rows].numpy(), p_tilde[rows], atol=1e-12)
            assert np.allclose(approx_.out[b, h, rows].numpy(), p_tilde[rows] @ v, atol=1e-12)
            assert np.allclose(approx_.p[b, h, rows].sum(-1).numpy(), 1, atol=1e-12), "rows sum to one"
    assert torch.isfinite(approx_.out).all() and torch.isfinite(approx_.p).all()


def test_performer_causal_on_a_bidirectional_layer_is_performer() -> None:
    x = layer()
    assert not x.causal
    causal, full = approximate("performer-causal", x, 6), approximate("performer", x, 6)
    assert torch.equal(causal.out, full.out) and torch.equal(causal.p, full.p)


@pytest.mark.parametrize("block", [1, 5, N, 1000])
def test_performer_causal_prefix_sums_do_not_depend_on_the_block(block, monkeypatch) -> None:
    from methods.causal_layers import layer as causal_layer

    x = causal_layer(side="left", spread=1.5)
    want = approximate("performer-causal", x, 7)
    assert torch.allclose(want.out, want.p @ x.v, atol=1e-12), "the prefix sums give P̃ V"
    monkeypatch.setattr(performer, "CAUSAL_BLOCK", block)
    got = approximate("performer-causal", x, 7)
    assert torch.allclose(got.out, want.out, atol=1e-12) and torch.equal(got.p, want.p)


def test_performer_causal_scales_keys_by_what_the_query_has_seen() -> None:
    """A first key whose features are all far below a later key's (e^-140 in float32): one factor for the
    whole sequence, as `performer` takes, would underflow the first rows to zero; the running maximum
    keeps them exact (a query that sees one key puts all its weight on it)."""
    from methods.causal_layers import layer as causal_layer

    x = causal_layer((N, N), side="right", dtype=torch.float32)
    k = x.k.clone()
    k[..., 0, :] = 20 / math.sqrt(S) * k[..., 0, :] / k[..., 0, :].norm(dim=-1, keepdim=True)  # √s‖k_0‖ = 20
    x = replace(x, k=k, _p=None)
    log_k = performer.log_features(x.k * math.sqrt(S), performer.performer_features(x, 16, draws(x)))
    assert (torch.exp(log_k[..., 0, :] - log_k.amax((-2, -1))[..., None]) == 0).all(), "one global factor underflows"
    approx_ = approximate("performer-causal", x, 16)
    assert torch.allclose(approx_.p[..., 0, 0], torch.ones(()))
    assert torch.allclose(approx_.out[..., 0, :], x.v[..., 0, :])
    assert torch.allclose(approx_.p.sum(-1), torch.ones(()), atol=1e-5)


def test_performer_causal_converges_with_more_features() -> None:
    from methods.causal_layers import layer as causal_layer

    x = causal_layer(side="left", spread=0.5)
    errors = {m: np.mean([measures(x, approximate("performer-causal", x, m, draws(x, seed=seed)))[0].mean()
                          for seed in range(5)]) for m in (64, 4096)}
    assert errors[4096] < errors[64] / 3.5 and errors[4096] < 0.05, errors


def test_performer_causal_uses_performers_features() -> None:
    from methods.causal_layers import layer as causal_layer

    x = causal_layer(side="right", n=N)
    bidirectional = replace(x, causal=False, _p=None)
    # the last query of a full-length causal sequence sees every key: its row is performer's
    causal, full = approximate("performer-causal", x, 5), approximate("performer", bidirectional, 5)
    assert torch.allclose(causal.p[0, :, -1], full.p[0, :, -1], atol=1e-12)
    assert torch.allclose(causal.out[0, :, -1], full.out[0, :, -1], atol=1e-12)
