"""Shared helpers of the calibration and fit tests: synthetic calibration data and the dense numpy objective."""

from __future__ import annotations

import numpy as np
import torch

from spectra.nn.calibration import Calibration


def synthetic(layer: int = 0, lengths=(10, 10, 7, 10, 4, 10), n: int = 10, heads: int = 2, d: int = 3,
              dtype=torch.float64, seed: int = 0) -> Calibration:
    """Gaussian q, k, v with a shared key component and a positional trend, padded after `lengths`."""
    g = torch.Generator().manual_seed(seed + 17 * layer)
    shape = (len(lengths), heads, n, d)
    position = torch.linspace(-1, 1, n, dtype=dtype)[None, None, :, None]
    trend = position * torch.randn(1, heads, 1, d, generator=g, dtype=dtype)
    q, k, v = (torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))
    k = k + trend + torch.randn(1, heads, 1, d, generator=g, dtype=dtype)
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return Calibration(layer, q, k, v, valid, 0.7)


def reference_error(calib: Calibration, e: torch.Tensor, f: torch.Tensor) -> np.ndarray:
    """Each sequence's valid block alone, in numpy: ‖PV − softmax(Q (E K)ᵀ s)(F V)‖² / ‖PV‖²."""
    out = np.zeros((calib.sequences, calib.heads))
    for s in range(calib.sequences):
        m = int(calib.valid[s].sum())
        for h in range(calib.heads):
            q, k, v = (x[s, h, :m].numpy() for x in (calib.q, calib.k, calib.v))
            eh, fh = (x[h if x.shape[0] > 1 else 0, :, :m].numpy() for x in (e, f))

            def softmax(x):
                x = np.exp(x - x.max(-1, keepdims=True))
                return x / x.sum(-1, keepdims=True)

            exact = softmax(q @ k.T * calib.scaling) @ v
            approx = softmax(q @ (eh @ k).T * calib.scaling) @ (fh @ v)
            out[s, h] = ((exact - approx) ** 2).sum() / (exact ** 2).sum()
    return out
