"""`spectra analyze`'s probe: every layer's P streamed into per-(layer, head) moments of c, σ and the metrics.

Index convention: curves are on the relative grid j/n, j = 1…n (see `spectra.spectrum`); `sigma` keeps
the absolute index, with zeros past a sequence's length. Results: `metrics.csv` (one row per layer and
head, mean and std of every metric) and `curves.npz` (index, cum_mean, cum_std, sigma_mean, sigma_std).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..config import Spectrum
from ..spectrum import METRICS, masked, row_metrics, singular_values, sink_start, summarize
from ..stats import Moments, State
from .base import Probe


class SpectrumProbe(Probe):
    """Moments over sequences of the normalized cumulative curve, σ and METRICS of every (layer, head)."""

    def __init__(self, layers: int, heads: int, n: int, at: int, mode: Spectrum | str = Spectrum.EXACT) -> None:
        if not 1 <= at <= n:
            raise ValueError(f"at must be in 1…{n}, got {at}")
        self.layers, self.heads, self.n, self.at, self.mode = layers, heads, n, at, Spectrum(mode)
        self.cum = Moments.zeros((layers, heads, n))
        self.sigma = Moments.zeros((layers, heads, n))
        self.metrics = Moments.zeros((layers, heads, len(METRICS)))

    def update(self, captured: Captured) -> None:
        self.add(captured.layer, captured.p, captured.valid)

    def add(self, layer: int, p: torch.Tensor, valid: torch.Tensor) -> None:
        """Add one layer's P (B, H, w, w), w ≤ n, whose valid key positions are `valid` (B, w), on any device."""
        batch, heads, width, _ = p.shape
        if width > self.n or heads != self.heads:
            raise ValueError(f"expected P of {self.heads} heads and n ≤ {self.n}, got {heads} and {width}")
        p = masked(p, valid)
        sigma = singular_values(p, self.mode)
        lengths = valid.sum(-1)[:, None].expand(batch, heads).to(sigma.device)  # sigma may be on the CPU (mps)
        grid, metrics = summarize(sigma, lengths, self.at, self.n)
        rows = row_metrics(p, valid, sink_start(self.n)).to(metrics.device)
        metrics = torch.cat([metrics, rows.to(metrics.dtype)], dim=-1)
        sigma = torch.where(torch.arange(width, device=sigma.device) < lengths[..., None], sigma, 0.0)
        sigma = torch.nn.functional.pad(sigma, (0, self.n - width))
        self.cum.add(layer, grid)
        self.sigma.add(layer, sigma)
        self.metrics.add(layer, metrics)

    def state(self) -> State:
        return {**self.cum.state("cum"), **self.sigma.state("sigma"), **self.metrics.state("metrics")}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.cum = Moments.from_arrays(arrays, "cum")
        self.sigma = Moments.from_arrays(arrays, "sigma")
        self.metrics = Moments.from_arrays(arrays, "metrics")

    def tables(self) -> dict[str, pd.DataFrame]:
        """metrics.csv: one row per (layer, head): sequences, then mean and std of every metric."""
        layer, head = np.meshgrid(np.arange(self.layers), np.arange(self.heads), indexing="ij")
        columns: dict[str, np.ndarray] = {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "sequences": self.metrics.count.ravel().astype(np.int64),
        }
        mean, std = self.metrics.mean, self.metrics.std
        for i, name in enumerate(METRICS):
            columns[f"{name}_mean"] = mean[..., i].ravel()
            columns[f"{name}_std"] = std[..., i].ravel()
        return {"metrics.csv": pd.DataFrame(columns)}

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """curves.npz: the mean curves (layers, heads, n) and σ."""
        return {"curves.npz": {"index": np.arange(1, self.n + 1), "cum_mean": self.cum.mean, "cum_std": self.cum.std,
                               "sigma_mean": self.sigma.mean, "sigma_std": self.sigma.std}}
