"""The linformer method is eq. 7 with the seeded E, F of the Linformer module, under every sharing level."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layers import H, N, approximate, random_layer, softmax
from spectra.config import Sharing
from spectra.nn.linformer import linear_attention
from spectra.nn.projections import jl_pair


def layer(lengths=(N, N)):
    """Padded float64 layer with the capture's P, score scale 0.7."""
    return random_layer(lengths)


@pytest.mark.parametrize("sharing", list(Sharing))
def test_linformer_is_eq7(sharing) -> None:
    x = layer(lengths=(N, 9))
    approx = approximate(f"linformer({sharing})", x, 5)
    e, f = jl_pair(sharing, 3, H, 5, N, 0)
    for b, m in enumerate((N, 9)):
        for h in range(H):
            ek = e[h, :, :m].double().numpy() @ x.k[b, h, :m].numpy()
            fv = f[h, :, :m].double().numpy() @ x.v[b, h, :m].numpy()
            want = softmax(x.q[b, h, :m].numpy() @ ek.T * 0.7) @ fv
            assert np.allclose(approx.out[b, h, :m].numpy(), want, atol=1e-6)
    module = linear_attention(x.q, x.k, x.v, e.double(), f.double(), None, 0.7)
    assert torch.allclose(approx.out[0], module[0], atol=1e-10), "the registry uses the Linformer module's eq. 7"
