"""Mean and max pooling against their windows and formula written in numpy; k = n is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layers import H, N, approximate, random_layer, softmax


def layer(lengths=(N, N)):
    """Padded float64 layer with the capture's P, score scale 0.7."""
    return random_layer(lengths)


def test_pooling_windows_and_formulas() -> None:
    x = layer(lengths=(N, 10))
    budget, m = 3, 10
    windows = [range(0, 4), range(4, 7), range(7, 10)]  # ⌊rank·3/10⌋
    mean, top = approximate("pool-mean", x, budget), approximate("pool-max", x, budget)
    for h in range(H):
        q, k, v = (t[1, h].numpy() for t in (x.q, x.k, x.v))
        sizes = np.log([len(w) for w in windows])
        for reduce, approx in ((np.mean, mean), (np.max, top)):
            k_bar = np.stack([reduce(k[list(w)], axis=0) for w in windows])
            v_bar = np.stack([reduce(v[list(w)], axis=0) for w in windows])
            want = softmax(q[:m] @ k_bar.T * 0.7 + sizes) @ v_bar
            assert np.allclose(approx.out[1, h, :m].numpy(), want, atol=1e-10)
    assert top.p is None and mean.p is not None
    assert torch.allclose(mean.p[1, :, :m].sum(-1), torch.ones(H, m, dtype=torch.float64))


@pytest.mark.parametrize("name", ["pool-mean", "pool-max"])
def test_full_budget_is_exact_on_valid_rows(name) -> None:
    x = layer(lengths=(N, 7))
    out = approximate(name, x, N).out
    for b, m in enumerate((N, 7)):
        assert np.allclose(out[b, :, :m].numpy(), (x.p @ x.v)[b, :, :m].numpy(), atol=1e-10)
