"""The truncated SVD against numpy's, and its exact limit at k = n."""

from __future__ import annotations

import numpy as np
import pytest

from layers import B, H, N, dense_p, random_layer
from spectra.methods import REGISTRY


def layer(lengths=(N, N), projection="gaussian"):
    """Padded float64 layer with the capture's P, score scale 0.7."""
    return random_layer(lengths, projection=projection)


def test_svd_is_numpy_truncated_svd() -> None:
    x = layer()
    approx = REGISTRY["svd"].run(x, 4)
    for b in range(B):
        for h in range(H):
            u, s, vt = np.linalg.svd(dense_p(x, b, h, N))
            assert np.allclose(approx.p[b, h].numpy(), (u[:, :4] * s[:4]) @ vt[:4], atol=1e-10)


def test_full_budget_is_exact_on_valid_rows() -> None:
    x = layer(lengths=(N, 7))
    out = REGISTRY["svd"].run(x, N).out
    for b, m in enumerate((N, 7)):
        assert np.allclose(out[b, :, :m].numpy(), (x.p @ x.v)[b, :, :m].numpy(), atol=1e-10)
