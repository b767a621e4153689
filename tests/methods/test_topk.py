"""The top-k sparse oracle against a dense numpy loop over queries, its ties, exact limit and optimality."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from layers import H, N, approximate, exact_on_valid_rows, softmax
from methods.causal_layers import allowed, layer, valid_rows
from spectra.probes.approx import measures

KINDS = [("left", True), ("right", True), ("right", False)]


@pytest.mark.parametrize("side,causal", KINDS)
@pytest.mark.parametrize("budget", [1, 3, 6])
def test_topk_is_softmax_over_the_k_largest_scores(side, causal, budget) -> None:
    x = layer(side=side, causal=causal)
    approx = approximate("topk", x, budget)
    for b in range(2):
        rows = valid_rows(x, b)
        for h in range(H):
            q, k, v = (t[b, h].numpy() for t in (x.q, x.k, x.v))
            want = np.zeros((N, N))
            for i in rows:
                scores = q[i] @ k.T * x.scaling
                keep = sorted(sorted(allowed(x, b, i), key=lambda j: (-scores[j], j))[:budget])
                want[i, keep] = softmax(scores[keep])
            assert np.allclose(approx.p[b, h, rows].numpy(), want[rows], atol=1e-12)
            assert np.allclose(approx.out[b, h, rows].numpy(), want[rows] @ v, atol=1e-12)
    assert torch.isfinite(approx.out).all()


@pytest.mark.parametrize("causal", [True, False])
def test_topk_ties_go_to_the_earlier_position(causal) -> None:
    x = layer(side="right", causal=causal)
    k = x.k.clone()
    k[..., 2, :] = k[..., 6, :] = 5 * x.q[..., 9:10, :].squeeze(-2)  # the same largest score for query 9
    x = replace(x, k=k, _p=None)
    p = approximate("topk", x, 1).p[0, :, 9]
    assert (p[:, 2] == 1).all() and (p[:, 6] == 0).all()
    p = approximate("topk", x, 2).p[0, :, 9]
    assert torch.allclose(p[:, 2], p[:, 6]) and torch.allclose(p[:, 2], torch.full((H,), 0.5, dtype=p.dtype))
    k[..., 4, :] = 6 * x.q[..., 9, :]  # one key above the tie: it and the earlier of the tied two
    p = approximate("topk", replace(x, k=k, _p=None), 2).p[0, :, 9]
    assert ((p[:, 4] > 0) & (p[:, 2] > 0)).all() and (p[:, 6] == 0).all() and (p > 0).sum() == 2 * H


@pytest.mark.parametrize("side,causal", KINDS)
def test_topk_with_k_at_least_n_is_exact(side, causal) -> None:
    x = layer(side=side, causal=causal)
    assert exact_on_valid_rows(x, approximate("topk", x, N), atol=1e-12)


@pytest.mark.parametrize("side,causal", KINDS)
def test_topk_is_the_total_variation_oracle_among_k_key_rows(side, causal) -> None:
    """A row renormalised on a set S is 1 − P(S) away in total variation: the k largest entries minimise it,
    so no k-key method (the window among them) does better on any row."""
    x = layer(side=side, causal=causal, spread=1.5)
    for budget in (2, 5):
        top, near = (measures(x, approximate(name, x, budget))[2] for name in ("topk", "window"))
        assert (top <= near + 1e-12).all() and (top < near).any()
