"""The truncated SVD against numpy's, and its exact limit at k = n."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layers import B, H, N, approximate, dense_p, exact_on_valid_rows, random_layer


def layer(lengths=(N, N)):
    """Padded float64 layer with the capture's P, score scale 0.7."""
    return random_layer(lengths)


def test_svd_is_numpy_truncated_svd() -> None:
    x = layer()
    approx = approximate("svd", x, 4)
    for b in range(B):
        for h in range(H):
            u, s, vt = np.linalg.svd(dense_p(x, b, h, N))
            assert np.allclose(approx.p[b, h].numpy(), (u[:, :4] * s[:4]) @ vt[:4], atol=1e-10)


def test_full_budget_is_exact_on_valid_rows() -> None:
    x = layer(lengths=(N, 7))
    out = approximate("svd", x, N).out
    for b, m in enumerate((N, 7)):
        assert np.allclose(out[b, :, :m].numpy(), (x.p @ x.v)[b, :, :m].numpy(), atol=1e-10)


# ---------------------------------------------------------------- svd-causal


def prefix_truncation(p: np.ndarray, budget: int) -> np.ndarray:
    """Row i = row i of numpy's rank-k truncated SVD of the prefix block p[:i+1, :i+1]."""
    n = p.shape[0]
    rows = np.zeros_like(p)
    for i in range(n):
        u, s, vt = np.linalg.svd(p[:i + 1, :i + 1])
        rows[i, :i + 1] = (u[i, :budget] * s[:budget]) @ vt[:budget]
    return rows


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("budget", [1, 3, 5])
def test_svd_causal_is_each_prefix_blocks_truncated_svd(side, budget) -> None:
    from methods.causal_layers import dense_p as causal_p, layer as causal_layer, valid_rows

    x = causal_layer(side=side)
    approx = approximate("svd-causal", x, budget)
    for b in range(B):
        rows = valid_rows(x, b)
        for h in range(H):
            p = causal_p(x, b, h)
            assert np.allclose(x.p[b, h].numpy(), p, atol=1e-12)
            want = prefix_truncation(p, budget)
            assert np.allclose(approx.p[b, h, rows].numpy(), want[rows], atol=1e-10)
            assert np.allclose(approx.out[b, h, rows].numpy(), want[rows] @ x.v[b, h].numpy(), atol=1e-10)
            assert np.allclose(np.triu(approx.p[b, h].numpy(), 1), 0), "nothing after the query"
    assert torch.isfinite(approx.out).all()


@pytest.mark.parametrize("side", ["left", "right"])
def test_svd_causal_is_exact_at_full_rank_and_on_the_first_k_valid_rows(side) -> None:
    from methods.causal_layers import layer as causal_layer

    x = causal_layer(side=side)
    assert exact_on_valid_rows(x, approximate("svd-causal", x, N), atol=1e-10)
    budget = 4
    approx = approximate("svd-causal", x, budget)
    for b in range(B):
        first = np.flatnonzero(x.valid[b].numpy())[:budget]
        assert torch.allclose(approx.p[b, :, first], x.p[b, :, first], atol=1e-10)
        later = np.flatnonzero(x.valid[b].numpy())[budget:]
        assert not torch.allclose(approx.p[b, :, later], x.p[b, :, later], atol=1e-3), "an approximation after that"


def test_svd_causal_on_a_bidirectional_layer_is_svd() -> None:
    x = layer(lengths=(N, 7))
    causal, full = approximate("svd-causal", x, 4), approximate("svd", x, 4)
    assert torch.equal(causal.p, full.p) and torch.equal(causal.out, full.out)


def test_svd_causal_error_falls_as_k_grows() -> None:
    """Row i's residual is Σ_{r>k} u_ir² σ_r² of its prefix block: it never grows with k."""
    from methods.causal_layers import layer as causal_layer
    from spectra.probes.approx import measures

    x = causal_layer(side="left", n=16, lengths=(16, 11))
    errors = [measures(x, approximate("svd-causal", x, budget))[1] for budget in (2, 4, 8, 16)]
    assert all((small >= large - 1e-12).all() for small, large in zip(errors, errors[1:]))
    assert (errors[-1] < 1e-10).all()
