"""Nyströmformer (exact and iterative pseudo-inverse) against three dense numpy softmaxes, and its exact limit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layers import (H, N, approximate, captured, draws, exact_on_valid_rows, float32_qkv, head, random_layer,
                    rounding_sensitivity, softmax)
from spectra.methods import REGISTRY, Layer, nystrom

LENGTHS = (N, 7)
S = 0.7  # the score scale s


def layer(lengths=LENGTHS, n=N, seed=0, spread=1.0):
    """Padded float64 layer; P computed from q and k (as a substitution sees it)."""
    return random_layer(lengths, n=n, seed=seed, spread=spread, scaling=S, use_p=False)


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
    approx_ = approximate(name, x, budget)
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            want = dense_nystrom(x, b, h, m, budget, pinv)
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), want, atol=1e-8)
            assert np.allclose(approx_.out[b, h, :m].numpy(), want @ x.v[b, h, :m].numpy(), atol=1e-8)


@pytest.mark.parametrize("lengths", [(N, N), LENGTHS])
def test_nystrom_with_every_token_a_landmark_is_exact(lengths) -> None:
    x = layer(lengths)
    approx_ = approximate("nystrom", x, N)
    assert exact_on_valid_rows(x, approx_, atol=1e-9)
    assert exact_on_valid_rows(x, nystrom.Nystrom("nystrom-iter60", 60)(x, N, draws(x)), atol=1e-6), "the iteration converges to A⁺"


#: float32 layers whose A = softmax(Q̃ K̃ᵀ s) is ill-conditioned (n = 24, d = 8, k = 12, q, k, v ~ N(0, 2.2²)):
#: a float32 A⁺ moved the output by 2.5e-3–1.1e-2 under a one-ulp change of q, k, v
ILL = dict(n=24, d=8, spread=2.2, scaling=S)
ILL_LENGTHS, ILL_BUDGET = (24, 19), 12


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nystrom_of_float32_inputs_is_the_float64_formula(seed) -> None:
    """On float32 q, k, v the result is the dense float64 formula on the same numbers (pseudo-inverse cutoff
    k·ε₃₂·σ₁), rounded to float32 once: the ill-conditioned core runs in float64."""
    q, k, v = float32_qkv(ILL_LENGTHS, n=ILL["n"], d=ILL["d"], seed=seed, spread=ILL["spread"])
    x = Layer.of(captured(q, k, v, ILL_LENGTHS, S), use_p=False)
    reference = Layer.of(captured(q.double(), k.double(), v.double(), ILL_LENGTHS, S), use_p=False)
    got = approximate("nystrom", x, ILL_BUDGET)
    assert got.out.dtype == got.p.dtype == torch.float32
    cutoff = ILL_BUDGET * np.finfo(np.float32).eps
    for b, m in enumerate(ILL_LENGTHS):
        for h in range(H):
            want = dense_nystrom(reference, b, h, m, ILL_BUDGET, lambda a: np.linalg.pinv(a, rcond=cutoff))
            assert relative(got.p[b, h, :m, :m].double().numpy(), want) < 1e-6
            assert relative(got.out[b, h, :m].double().numpy(), want @ reference.v[b, h, :m].numpy()) < 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nystrom_moves_by_little_more_than_its_inputs_under_rounding(seed) -> None:
    """A one-ulp relative change of float32 q, k, v (what another machine's rounding does) moves the output by
    at most 1e-4 relative. In float64 the change is the inputs' own, amplified by cond(A): ≤ 1.4e-5 on these
    layers, 4e-5 on the regression's tiny RoBERTa; a float32 A⁺ gave 2.5e-3–1.1e-2 here."""
    change = rounding_sensitivity(REGISTRY["nystrom"], ILL_LENGTHS, ILL_BUDGET, seed=seed, **ILL)
    assert change < 1e-4, change
