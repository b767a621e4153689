"""Nyströmformer (exact and iterative pseudo-inverse) against three dense numpy softmaxes, and its exact limit."""

from __future__ import annotations

import numpy as np
import pytest

from layers import H, N, exact_on_valid_rows, head, random_layer, softmax
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
    approx_ = REGISTRY[name].run(x, budget)
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            want = dense_nystrom(x, b, h, m, budget, pinv)
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), want, atol=1e-8)
            assert np.allclose(approx_.out[b, h, :m].numpy(), want @ x.v[b, h, :m].numpy(), atol=1e-8)


@pytest.mark.parametrize("lengths", [(N, N), LENGTHS])
def test_nystrom_with_every_token_a_landmark_is_exact(lengths) -> None:
    x = layer(lengths)
    approx_ = REGISTRY["nystrom"].run(x, N)
    assert exact_on_valid_rows(x, approx_, atol=1e-9)
    assert exact_on_valid_rows(x, nystrom.nystrom_method(60)(x, N), atol=1e-6), "the iteration converges to A⁺"
