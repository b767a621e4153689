"""Theorem 1's P Rᵀ R against numpy, padded columns dropped; orthogonal R at k = n is exact."""

from __future__ import annotations

import numpy as np
import torch

from layers import H, N, approximate, dense_p, draws, random_layer


def layer(lengths=(N, N)):
    """Padded float64 layer with the capture's P, score scale 0.7."""
    return random_layer(lengths)


def test_jl_orthogonal_at_full_budget_is_exact() -> None:
    x = layer()
    approx = approximate("jl", x, N, draws(x, projection="orthogonal"))
    assert torch.allclose(approx.p, x.p, atol=1e-10) and torch.allclose(approx.out, x.p @ x.v, atol=1e-10)


def test_jl_is_p_rt_r_with_padded_columns_dropped() -> None:
    x = layer(lengths=(N, 8))
    approx = approximate("jl", x, 5)
    r = draws(x).matrix(x, 5).numpy()  # (H, 5, N)
    for h in range(H):
        p = dense_p(x, 1, h, 8)
        want = p @ r[h, :, :8].T @ r[h, :, :8]
        assert np.allclose(approx.p[1, h, :8, :8].numpy(), want, atol=1e-10)
        assert np.allclose(approx.out[1, h, :8].numpy(), want @ x.v[1, h, :8].numpy(), atol=1e-10)
