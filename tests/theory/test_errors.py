"""The dense error kernels against plain formulas (dense loops, numpy's SVD), and the JL lemma on synthetic vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from layers import attention_probs
from spectra.errors import SpectraError
from spectra.seeds import jl_matrix, orthogonal_matrix
from spectra.sources import gaussian_qkv
from spectra.theory.bounds import delta_value, jl_failure_bound
from spectra.theory.errors import as_float, best_rank_errors, jl_inner_errors, theorem1_errors, theorem2_errors

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("eps,budget", [(0.5, 32), (0.5, 64), (0.3, 128)])
def test_jl_lemma_failure_rate_is_within_the_bound(eps, budget) -> None:
    """Over 1500 seeds of R, Pr(|x RᵀR yᵀ − x yᵀ| > ε‖x‖‖y‖) ≤ 2e^{−(ε²−ε³)k/4}."""
    generator = np.random.default_rng(0)
    x, y = torch.from_numpy(generator.standard_normal((2, 256))).float()
    y = 0.6 * x + 0.8 * y  # correlated, so x yᵀ ≠ 0
    r = torch.stack([jl_matrix(budget, 256, seed) for seed in range(1500)])
    failure = (jl_inner_errors(x, y, r) > eps).float().mean().item()
    assert failure <= jl_failure_bound(eps, budget)
    # the check can fail: R with 4× the variance breaks the lemma
    assert (jl_inner_errors(x, y, 2 * r[:300]) > eps).float().mean().item() > jl_failure_bound(eps, budget)


def test_jl_inner_errors_against_dense() -> None:
    generator = np.random.default_rng(3)
    x, y = torch.from_numpy(generator.standard_normal((2, 40)))
    r = jl_matrix(12, 40, seed=5, dtype=torch.float64)
    want = abs(float((r @ x) @ (r @ y)) - float(x @ y)) / (float(x.norm()) * float(y.norm()))
    assert jl_inner_errors(x, y, r).item() == pytest.approx(want, rel=1e-12)


def test_theorem1_errors_against_dense() -> None:
    q, k, v = gaussian_qkv(24, 5, heads=2, batch=2, seed=0)
    p = attention_probs(q, k)
    r = jl_matrix(8, 30, seed=1)
    got = theorem1_errors(p, v, r)
    assert got.shape == (2, 2, 5)
    p_tilde = p @ r[:, :24].T @ r[:, :24]  # rank ≤ 8
    assert torch.linalg.matrix_rank(p_tilde[0, 0]).item() <= 8
    for b in range(2):
        for h in range(2):
            for col in range(5):
                w = v[b, h, :, col]
                want = (p_tilde[b, h] @ w - p[b, h] @ w).norm() / (p[b, h] @ w).norm()
                assert got[b, h, col].item() == pytest.approx(want.item(), rel=1e-4)


def test_theorem1_errors_per_head_r_and_too_few_columns() -> None:
    q, k, v = gaussian_qkv(16, 3, heads=2, batch=1, seed=1)
    p = attention_probs(q, k)
    r = torch.stack([jl_matrix(4, 16, seed=0), jl_matrix(4, 16, seed=1)])  # (H, budget, n): one R per head
    got = theorem1_errors(p, v, r)
    for h in range(2):
        assert torch.allclose(got[:, h], theorem1_errors(p[:, h:h + 1], v[:, h:h + 1], r[h])[:, 0])
    with pytest.raises(SpectraError, match="draw R with n ≥ 16") as error:
        theorem1_errors(p, v, jl_matrix(4, 15))
    assert "\n" not in str(error.value)


def test_best_rank_errors_against_numpy_svd() -> None:
    q, k, v = gaussian_qkv(20, 4, heads=2, batch=1, seed=5)
    p = attention_probs(q, k)
    got = best_rank_errors(p, v, [1, 5, 20])
    assert got.shape == (3, 1, 2, 4)
    u, s, vt = np.linalg.svd(p[0, 1].double().numpy())
    for i, budget in enumerate([1, 5, 20]):
        p_k = u[:, :budget] * s[:budget] @ vt[:budget]
        w = v[0, 1].double().numpy()
        dense = p[0, 1].double().numpy()
        want = np.linalg.norm(p_k @ w - dense @ w, axis=0) / np.linalg.norm(dense @ w, axis=0)
        assert np.allclose(got[i, 0, 1].numpy(), want, atol=1e-4)
    assert got[2].abs().max() < 1e-3  # full rank reproduces P


def test_k_equals_n_with_orthogonal_projection_is_exact() -> None:
    q, k, v = gaussian_qkv(32, 6, heads=2, batch=2, seed=2)
    p = attention_probs(q, k)
    assert theorem1_errors(p, v, orthogonal_matrix(32, 32, seed=3)).max() < 1e-4
    assert theorem1_errors(p, v, jl_matrix(32, 32, seed=3)).max() > 1e-2  # JL is only approximately isometric


def test_theorem2_errors_against_dense_rows() -> None:
    q, k, v = gaussian_qkv(16, 4, heads=2, batch=2, seed=9)
    a = q @ k.transpose(-1, -2) / 2.0
    r = jl_matrix(6, 16, seed=0)
    valid = torch.ones(2, 16, dtype=torch.bool)
    valid[1, 11:] = False
    deltas = [torch.tensor([0.5, 0.25], dtype=torch.float64), 1.0]
    rhs, out = theorem2_errors(a, v, r, deltas, valid)
    assert rhs.shape == out.shape == (2, 2, 2, 16)
    for i, delta in enumerate(deltas):
        for b, m in enumerate([16, 11]):
            dv = float(delta[b]) if torch.is_tensor(delta) else delta
            e, f, vb = dv * r[:, :m], math.exp(-dv) * r[:, :m], v[b, :, :m]
            for h in range(2):
                for row in range(m):
                    w = a[b, h, row, :m]
                    exact = torch.softmax(w, 0) @ vb[h]
                    err = (torch.softmax(w @ e.T, 0) @ (f @ vb[h]) - exact).norm()
                    theorem_rhs = torch.softmax(w, 0).norm() * vb[h].norm()  # Frobenius norm of V
                    assert rhs[i, b, h, row].item() == pytest.approx((err / theorem_rhs).item(), rel=1e-4)
                    assert out[i, b, h, row].item() == pytest.approx((err / exact.norm()).item(), rel=1e-4)


def test_tiny_delta_is_the_uniform_limit() -> None:
    q, k, v = gaussian_qkv(64, 4, seed=1)
    a = attention_probs(q, k).log()
    r = jl_matrix(8, 64, seed=0)
    rhs, out = theorem2_errors(a, v, r, [delta_value("1/2^n", 64), delta_value("1/2^n", 2000), 0.0])
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    uniform = (r @ v[0, 0]).mean(0)  # softmax(0) = 1/k, F = R
    exact = attention_probs(q, k)[0, 0] @ v[0, 0]
    assert torch.allclose(out[2, 0, 0], (uniform - exact).norm(dim=-1) / exact.norm(dim=-1), rtol=1e-4)


def test_as_float_promotes_half_precision_only() -> None:
    assert as_float(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert as_float(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    assert as_float(torch.ones(2, dtype=torch.float64)).dtype == torch.float64
