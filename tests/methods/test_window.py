"""StreamingLLM's sinks plus sliding window against a dense numpy loop over queries, and its exact limit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layers import H, N, approximate, exact_on_valid_rows, softmax
from methods.causal_layers import allowed, layer, valid_rows
from spectra.methods import window

#: (side of the padding, causal): decoders pad on either side; an encoder's window is two-sided
KINDS = [("left", True), ("right", True), ("right", False)]


def kept(x, b: int, i: int, budget: int) -> list[int]:
    """The keys query i keeps, written out: the first s valid positions it may see, then the k − s other
    keys it may see nearest to it (ties to the earlier position)."""
    s = min(4, budget // 4)
    seen = allowed(x, b, i)
    sinks = [j for j in np.flatnonzero(x.valid[b].numpy())[:s] if j in seen]
    others = sorted((j for j in seen if j not in sinks), key=lambda j: (abs(i - j), j))
    return sorted(sinks + others[:budget - s])


@pytest.mark.parametrize("side,causal", KINDS)
@pytest.mark.parametrize("budget", [1, 3, 4, 6, 9])
def test_window_is_sinks_plus_nearest_keys(side, causal, budget) -> None:
    x = layer(side=side, causal=causal)
    approx = approximate("window", x, budget)
    for b in range(2):
        for h in range(H):
            q, k, v = (t[b, h].numpy() for t in (x.q, x.k, x.v))
            want = np.zeros((N, N))
            for i in valid_rows(x, b):
                keep = kept(x, b, i, budget)
                want[i, keep] = softmax(q[i] @ k[keep].T * x.scaling)
            rows = valid_rows(x, b)
            assert np.allclose(approx.p[b, h, rows].numpy(), want[rows], atol=1e-12)
            assert np.allclose(approx.out[b, h, rows].numpy(), want[rows] @ v, atol=1e-12)
    assert torch.isfinite(approx.out).all()


def test_window_keeps_k_keys_or_every_key_it_may_see() -> None:
    for side, causal in KINDS:
        x = layer((32, 20), side=side, causal=causal, n=32)
        for budget in (1, 5, 12, 19):
            count = (approximate("window", x, budget).p > 0).sum(-1)
            for b in range(2):
                for i in valid_rows(x, b):
                    assert (count[b, :, i] == min(budget, len(allowed(x, b, i)))).all(), (side, causal, budget, i)


def test_window_keeps_the_first_valid_tokens_as_sinks() -> None:
    x = layer((48, 36), side="left", n=48)
    budget = 20  # s = 4 sinks, a window of 16
    assert window.sinks(budget) == 4 and window.sinks(7) == 1 and window.sinks(3) == 0
    p = approximate("window", x, budget).p
    for b, first in enumerate((0, 12)):
        late = p[b, :, first + 24:]  # queries whose window of 16 starts well after the sinks
        assert late.shape[-2] == 24 - first
        assert (late[..., first:first + 4] > 0).all() and (late[..., first + 4:first + 8] == 0).all()
        assert (p[b, :, first + 24:, :first] == 0).all(), "padding is never a sink"


@pytest.mark.parametrize("side,causal", KINDS)
def test_window_with_k_at_least_n_is_exact(side, causal) -> None:
    x = layer(side=side, causal=causal)
    assert exact_on_valid_rows(x, approximate("window", x, N), atol=1e-12)
    if causal:  # query i of a causal layer sees i + 1 keys at most: the first k rows are exact already
        p = approximate("window", x, 5).p
        assert torch.allclose(p[0, :, :5], x.p[0, :, :5], atol=1e-12)
