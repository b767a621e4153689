"""Performer, Nyström, Skyformer and ProbSparse against their defining formulas written densely in numpy,
their exact limits, Performer's statistics, padding invariance, and one end-to-end run."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from spectra import families
from spectra.approximate import METHODS, Layer, expand_methods, measures
from spectra.errors import SpectraError
from spectra.pipeline import approx
from spectra.spectrum import masked
from spectra.theory import derive_seed

B, H, N, D = 2, 3, 12, 4
S = 0.7  # the score scale s
LENGTHS = (N, 7)
NEW = ["performer", "nystrom", "nystrom-iter6", "skyformer", "probsparse"]


def layer(lengths=LENGTHS, n=N, seed=0, spread=1.0) -> Layer:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(len(lengths), H, n, D, generator=g, dtype=torch.float64) * spread for _ in range(3))
    return with_lengths(q, k, v, lengths)


def with_lengths(q, k, v, lengths) -> Layer:
    mask = torch.zeros(len(lengths), 1, q.shape[-2], q.shape[-2], dtype=q.dtype)
    for b, m in enumerate(lengths):
        mask[b, ..., m:] = torch.finfo(q.dtype).min
    return Layer.captured(3, q, k, v, mask, None, S, seed=0)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def head(x: Layer, b: int, h: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(t[b, h, :m].numpy() for t in (x.q, x.k, x.v))


def close(x: Layer, approximation, atol: float) -> bool:
    """P̃ = P and Ṽ = P V on the valid rows (padded rows are never measured)."""
    rows = x.valid[:, None, :, None].to(x.p.dtype)
    return (torch.allclose(masked(approximation.p, x.valid), x.p, atol=atol)
            and torch.allclose(approximation.out * rows, x.p @ x.v, atol=atol))


def test_registered_and_reachable() -> None:
    assert expand_methods(NEW) == NEW
    assert expand_methods(["nystrom"]) == ["nystrom"], "the iterative variant is a separate name"
    with pytest.raises(SpectraError, match="unknown method 'fastformer'; valid methods: .*performer.*probsparse"):
        expand_methods(["fastformer"])


# ---------------------------------------------------------------- Performer


def phi(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """φ(x) = exp(−‖x‖²/2)/√m · exp(W x), row-wise, without any stabilisation."""
    return np.exp(x @ w.T - (x * x).sum(-1, keepdims=True) / 2) / math.sqrt(w.shape[0])


def test_performer_is_favor_plus() -> None:
    x, budget = layer(), 6
    approx_ = METHODS["performer"](x, budget)
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            w = families.orthogonal_features(budget, D, derive_seed(0, 601, budget, 3, h))
            q, k, v = head(x, b, h, m)
            phi_q, phi_k = phi(q * math.sqrt(S), w), phi(k * math.sqrt(S), w)
            p_tilde = (phi_q @ phi_k.T) / (phi_q @ phi_k.sum(0))[:, None]
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), p_tilde, atol=1e-12)
            assert np.allclose(approx_.p[b, h, :, m:].numpy(), 0), "padded keys have φ = 0"
            assert np.allclose(approx_.out[b, h, :m].numpy(), p_tilde @ v, atol=1e-12)


def test_orthogonal_features_structure() -> None:
    w = families.orthogonal_features(10, D, seed=5)
    assert w.shape == (10, D)
    for block in (w[:4], w[4:8]):
        gram = block @ block.T
        assert np.allclose(gram, np.diag(np.diag(gram)), atol=1e-12), "rows of a block are orthogonal"
    # each row is marginally N(0, I): E‖w‖² = d and E w = 0, over many seeds
    rows = np.concatenate([families.orthogonal_features(8, D, seed) for seed in range(500)])
    assert abs((rows ** 2).sum(1).mean() - D) < 4 * (rows ** 2).sum(1).std() / math.sqrt(len(rows))
    assert np.abs(rows.mean(0)).max() < 4 / math.sqrt(len(rows))


def test_performer_kernel_is_unbiased() -> None:
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=D) * 0.6, rng.normal(size=D) * 0.6
    root = math.sqrt(S)
    estimates = []
    for seed in range(4000):
        w = torch.from_numpy(families.orthogonal_features(8, D, seed))[None]  # (1, m, d)
        feats = families.log_features(torch.from_numpy(np.stack([q, k]) * root)[None, None], w).exp()[0, 0]
        estimates.append(float(feats[0] @ feats[1]))
    mean, error = np.mean(estimates), np.std(estimates) / math.sqrt(len(estimates))
    assert abs(mean - math.exp(S * q @ k)) < 4 * error and error < 0.02 * math.exp(S * q @ k)


def test_performer_converges_with_more_features() -> None:
    x = layer(spread=0.5)  # moderate norms: the estimator's variance grows like exp(‖x + y‖²)
    errors = {m: np.mean([measures(replace(x, seed=seed), METHODS["performer"](replace(x, seed=seed), m))[0].mean()
                          for seed in range(5)]) for m in (64, 4096)}
    assert errors[4096] < errors[64] / 3.5 and errors[4096] < 0.05, errors  # ~1/√m: a factor 8 at most


def test_performer_features_depend_on_budget_layer_head_seed() -> None:
    x = layer()
    w = families.performer_features(x, 5)
    assert w.shape == (H, 5, D) and not torch.allclose(w[0], w[1])
    assert not torch.allclose(w[:, :4], families.performer_features(x, 4))
    assert torch.equal(w, families.performer_features(layer(seed=9), 5)), "W depends on the run seed, not the data"


# ---------------------------------------------------------------- Nyström


def dense_nystrom(x: Layer, b: int, h: int, m: int, budget: int, pinv) -> np.ndarray:
    q, k, _ = head(x, b, h, m)
    windows = [w for w in (np.arange(m)[np.arange(m) * budget // m == c] for c in range(budget)) if len(w)]
    q_tilde = np.stack([q[w].mean(0) for w in windows])
    k_tilde = np.stack([k[w].mean(0) for w in windows])
    f, a, b_ = softmax(q @ k_tilde.T * S), softmax(q_tilde @ k_tilde.T * S), softmax(q_tilde @ k.T * S)
    return f @ pinv(a) @ b_


def newton_pinv(a: np.ndarray, iterations: int) -> np.ndarray:
    z = a.T / (np.abs(a).sum(0).max() * np.abs(a).sum(1).max())
    eye = np.eye(len(a))
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


@pytest.mark.parametrize("name, pinv", [("nystrom", np.linalg.pinv),
                                        ("nystrom-iter6", lambda a: newton_pinv(a, 6))])
@pytest.mark.parametrize("budget", [3, 5, 9])
def test_nystrom_is_three_softmaxes(name, pinv, budget) -> None:
    x = layer()  # budget 9 > 7 valid tokens: two windows are empty and masked
    approx_ = METHODS[name](x, budget)
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            want = dense_nystrom(x, b, h, m, budget, pinv)
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), want, atol=1e-8)
            assert np.allclose(approx_.out[b, h, :m].numpy(), want @ x.v[b, h, :m].numpy(), atol=1e-8)


@pytest.mark.parametrize("lengths", [(N, N), LENGTHS])
def test_nystrom_with_every_token_a_landmark_is_exact(lengths) -> None:
    x = layer(lengths)
    approx_ = METHODS["nystrom"](x, N)
    assert close(x, approx_, atol=1e-9)
    assert close(x, families.nystrom_method(60)(x, N), atol=1e-6), "the iteration converges to A⁺"


# ---------------------------------------------------------------- Skyformer


def gaussian(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.exp(-S * ((x[:, None] - y[None]) ** 2).sum(-1) / 2)


@pytest.mark.parametrize("budget", [4, 7])
def test_skyformer_is_reweighted_gaussian_nystrom(budget) -> None:
    x = layer(spread=0.7)
    approx_ = METHODS["skyformer"](x, budget)
    positions, present = families.skyformer_landmarks(x, budget)
    half = budget - budget // 2
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            q, k, v = head(x, b, h, m)
            at = positions[b, h].numpy()
            assert present[b].all() and len(set(at[:half])) == half and len(set(at[half:])) == budget - half
            assert at.max() < m, "landmarks are valid positions"
            landmarks = np.concatenate([q[at[:half]], k[at[half:]]])
            kernel = gaussian(q, landmarks) @ np.linalg.pinv(gaussian(landmarks, landmarks)) @ gaussian(landmarks, k)
            unnormalised = kernel * np.exp(S * (k * k).sum(-1) / 2)
            want = unnormalised / unnormalised.sum(-1, keepdims=True)
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), want, atol=1e-8)
            assert np.allclose(approx_.out[b, h, :m].numpy(), want @ v, atol=1e-8)
            # the same thing as a Nyström of the exponential kernel exp(s x·y) on these landmarks
            e = lambda a, c: np.exp(S * a @ c.T)  # noqa: E731
            direct = e(q, landmarks) @ np.linalg.inv(e(landmarks, landmarks)) @ e(landmarks, k)
            assert np.allclose(want, direct / direct.sum(-1, keepdims=True), atol=1e-6)


def test_skyformer_with_every_point_a_landmark_is_exact() -> None:
    x = layer(lengths=(6, 5), spread=0.5)  # k = 12 ≥ 2m: every valid query and key is a landmark
    assert close(x, METHODS["skyformer"](x, N), atol=1e-7)


# ---------------------------------------------------------------- ProbSparse


@pytest.mark.parametrize("budget", [1, 4, 7])
def test_probsparse_is_top_u_exact_rows_and_mean_v(budget) -> None:
    x = layer()
    approx_ = METHODS["probsparse"](x, budget)
    positions, used = families.probsparse_sample(x)
    for b, m in enumerate(LENGTHS):
        count = min(5 * math.ceil(math.log(m)), m)
        assert int(used[b].sum()) == count
        for h in range(H):
            q, k, v = head(x, b, h, m)
            sample = positions[b, h, :m, :count].numpy()
            assert sample.max() < m, "only valid keys are sampled"
            s = q @ k.T * S
            sampled = np.take_along_axis(s, sample, axis=1)
            sparsity = sampled.max(1) - sampled.mean(1)
            top = set(np.argsort(-sparsity, kind="stable")[:budget])
            want = np.stack([softmax(s[i]) if i in top else np.full(m, 1 / m) for i in range(m)])
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), want, atol=1e-12)
            assert np.allclose(approx_.out[b, h, :m].numpy(), want @ v, atol=1e-12)
            lazy = [i for i in range(m) if i not in top]
            assert np.allclose(approx_.out[b, h, lazy].numpy(), v.mean(0), atol=1e-12)


def test_probsparse_with_every_query_active_is_exact() -> None:
    x = layer()
    assert close(x, METHODS["probsparse"](x, N), atol=1e-12)
    seven = METHODS["probsparse"](x, 7)  # u = 7 ≥ m covers the padded sequence
    assert torch.allclose(seven.out[1] * x.valid[1, None, :, None], (x.p @ x.v)[1])


def test_probsparse_selections_are_nested_across_budgets() -> None:
    x = layer()
    active = [(METHODS["probsparse"](x, u).p - x.p).abs().sum(-1) == 0 for u in (2, 4, 6)]
    assert all((small <= large).all() for small, large in zip(active, active[1:]))


# ---------------------------------------------------------------- all of them


@pytest.mark.parametrize("name", NEW)
def test_padded_sequence_measures_as_alone(name) -> None:
    padded = layer()
    m = LENGTHS[1]
    alone = with_lengths(*(t[1:, :, :m] for t in (padded.q, padded.k, padded.v)), (m,))
    for budget in (1, 3, m):
        got, want = (measures(x, METHODS[name](x, budget))[:, -1] for x in (padded, alone))
        assert torch.allclose(got, want, atol=1e-9, equal_nan=True), (budget, got, want)
        out = METHODS[name](padded, budget).out
        assert torch.isfinite(out).all(), "padded rows stay finite (they feed the next layer)"


@pytest.mark.parametrize("name", NEW)
def test_float32_is_finite_and_p_rows_sum_to_one(name) -> None:
    x = layer(spread=1.5)
    x32 = Layer.captured(3, x.q.float(), x.k.float(), x.v.float(), None, None, S, seed=0)
    approx_ = METHODS[name](x32, 5)
    assert approx_.out.dtype == torch.float32 and torch.isfinite(approx_.out).all() and torch.isfinite(approx_.p).all()
    if name != "nystrom-iter6":  # an approximate A⁺ does not keep the rows' total mass at 1
        assert torch.allclose(approx_.p.sum(-1), torch.ones(B, H, N), atol=1e-3)


def test_end_to_end_through_the_pipeline(roberta_dir, text_file, tmp_path) -> None:
    n = 16
    run = approx(str(roberta_dir), str(text_file), budgets=[4, n], length=n, samples=4, batch_size=2,
                 methods=["svd", "linformer(kv)", "performer", "nystrom", "skyformer", "probsparse"], end_to_end=True,
                 out=tmp_path / "run", progress=None, notify=lambda line: None)
    heads = run.heads.pivot_table(index=["method", "budget"], columns="metric", values="mean")
    assert set(heads.index.get_level_values("method")) == {"svd", "linformer(kv)", "performer", "nystrom",
                                                            "skyformer", "probsparse"}
    assert np.isfinite(heads[["out_err", "p_err", "tv"]].to_numpy()).all()
    for method in ("nystrom", "probsparse"):
        assert heads.loc[(method, n), "out_err"] < 1e-4, "k = n is exact"
        assert heads.loc[(method, 4), "out_err"] > 1e-2
    e2e = run.end_to_end.set_index(["method", "budget"])
    assert e2e.loc[("probsparse", n), "hidden_rel_err"] < 1e-5 and e2e.loc[("probsparse", 4), "hidden_rel_err"] > 1e-3
    assert np.isfinite(e2e["ppl"]).all()
    for budgets in ([0], [n + 1]):
        with pytest.raises(SpectraError, match="k = "):
            approx(str(roberta_dir), str(text_file), budgets=budgets, length=n, samples=2, methods=["performer"],
                   out=tmp_path / "bad", progress=None, notify=lambda line: None)
    assert not (tmp_path / "bad").exists()
