"""`spectra analyze`'s probe: every layer's P streamed into per-(layer, head) moments of c, σ and the metrics.

Index convention: curves are on the relative grid j/n, j = 1…n (see `spectra.spectrum`); `sigma` keeps
the absolute index, with zeros past a sequence's length. Results: `metrics.csv` (one row per layer and
head, mean and std of every metric) and `curves.npz` (index, cum_mean, cum_std, sigma_mean, sigma_std).

A selection of layers and heads computes the spectra of those alone (long sequences: each spectrum costs
O(n³)); the others are NaN in the curves and absent from the table. With `bootstrap` = B the probe also
keeps B Poisson-bootstrap replicates of the mean rank for 90% and 99%: replicate r weights sequence i by
the r-th of B Poisson(1) draws seeded by (seed, i), i its global index in the run — the same weights for
every layer and head, whatever the batch it came in or the process that ran it — so the replicates are a
bootstrap over sequences, streaming and mergeable, and bitwise independent of the batch size and the number
of processes (ranks and weights are integers, so their float64 sums do not depend on the order of adding). They are
written to `bootstrap.npz`, from which `spectra scaling` gets the confidence interval of a growth exponent.
`add` takes the indices as required: there is no fallback to batch positions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..errors import InternalError
from ..seeds import Domain, derive_seed
from ..spectrum import (
    METRICS,
    masked,
    row_metrics,
    singular_values,
    sink_start,
    summarize,
)
from ..stats import Moments, State, tagged
from ..timings import stage
from .base import Probe

#: the metrics whose means are bootstrapped
BOOTSTRAPPED = ("rank90", "rank99")


class SpectrumProbe(Probe):
    """Moments over sequences of the normalized cumulative curve, σ and METRICS of every (layer, head)."""

    def __init__(self, layers: int, heads: int, n: int, at: int, *,
                 select_layers: Sequence[int] | None = None, select_heads: Sequence[int] | None = None,
                 bootstrap: int = 0, seed: int = 0) -> None:
        if not 1 <= at <= n:
            raise ValueError(f"at must be in 1…{n}, got {at}")
        self.layers, self.heads, self.n, self.at = layers, heads, n, at
        self.select_layers = set(range(layers) if select_layers is None else select_layers)
        self.select_heads = sorted(range(heads) if select_heads is None else select_heads)
        self.bootstrap, self.seed = bootstrap, seed
        #: the singular values' route (p (..., w, w) → σ (..., w), float64); `Offloaded` may set the batched GPU one
        self.solve: Callable[[torch.Tensor], torch.Tensor] = singular_values
        self.cum = Moments.zeros((layers, heads, n))
        self.sigma = Moments.zeros((layers, heads, n))
        self.metrics = Moments.zeros((layers, heads, len(METRICS)))
        self.boot_total = np.zeros((bootstrap, layers, heads, len(BOOTSTRAPPED)))
        self.boot_weight = np.zeros((bootstrap, layers, heads))

    def update(self, captured: Captured) -> None:
        if captured.layer in self.select_layers:
            self.add(captured.layer, captured.p, captured.valid, captured.sequence_index())

    def _weights(self, index: Sequence[int]) -> np.ndarray:
        """Poisson(1) bootstrap weights (B, bootstrap) of the sequences, fixed by their global indices."""
        return np.stack([np.random.default_rng(derive_seed(self.seed, Domain.BOOTSTRAP, i)).poisson(1.0, self.bootstrap)
                         for i in index]).astype(np.float64)

    def add(self, layer: int, p: torch.Tensor, valid: torch.Tensor, index: Sequence[int]) -> None:
        """Add one layer's P (B, H, w, w), w ≤ n, whose valid key positions are `valid` (B, w), on any device;
        `index`: the B sequences' global indices in the run (they seed the bootstrap weights)."""
        batch, heads, width, _ = p.shape
        if len(index) != batch:
            raise InternalError(f"layer {layer}: {len(index)} sequence indices for a batch of {batch} sequences")
        if layer not in self.select_layers:
            return
        if width > self.n or heads != self.heads:
            raise ValueError(f"expected P of {self.heads} heads and n ≤ {self.n}, got {heads} and {width}")
        chosen = self.select_heads
        if len(chosen) < heads:
            p, heads = p[:, chosen], len(chosen)
        p = p if bool(valid.all()) else masked(p, valid)  # nothing padded (pack mode): no copy
        with stage("spectra"):
            sigma = self.solve(p)
        lengths = valid.sum(-1)[:, None].expand(batch, heads).to(sigma.device)  # sigma may be on the CPU (mps)
        grid, metrics = summarize(sigma, lengths, self.at, self.n)
        rows = row_metrics(p, valid, sink_start(self.n)).to(metrics.device)
        metrics = torch.cat([metrics, rows.to(metrics.dtype)], dim=-1)
        sigma = torch.where(torch.arange(width, device=sigma.device) < lengths[..., None], sigma, 0.0)
        sigma = torch.nn.functional.pad(sigma, (0, self.n - width))
        slot = (layer, np.array(chosen)) if len(chosen) < self.heads else layer
        self.cum.add(slot, grid)
        self.sigma.add(slot, sigma)
        self.metrics.add(slot, metrics)
        if self.bootstrap:
            weights = self._weights(index)  # (B, R)
            values = metrics[..., [METRICS.index(name) for name in BOOTSTRAPPED]].to("cpu", torch.float64).numpy()
            self.boot_total[:, layer, chosen] += np.einsum("br,bhm->rhm", weights, values)
            self.boot_weight[:, layer, chosen] += weights.sum(0)[:, None]

    def state(self) -> State:
        return {**self.cum.state("cum"), **self.sigma.state("sigma"), **self.metrics.state("metrics"),
                **tagged({"boot.total": self.boot_total, "boot.weight": self.boot_weight})}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.cum = Moments.from_arrays(arrays, "cum")
        self.sigma = Moments.from_arrays(arrays, "sigma")
        self.metrics = Moments.from_arrays(arrays, "metrics")
        if "boot.total" in arrays:
            self.boot_total, self.boot_weight = np.array(arrays["boot.total"]), np.array(arrays["boot.weight"])

    def measured(self) -> np.ndarray:
        """Which (layer, head) the probe measured (layers, heads)."""
        return self.metrics.count > 0

    def tables(self) -> dict[str, pd.DataFrame]:
        """metrics.csv: one row per measured (layer, head): sequences, then mean and std of every metric."""
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
        table = pd.DataFrame(columns)
        if len(self.select_layers) < self.layers or len(self.select_heads) < self.heads:
            table = table[self.measured().ravel()].reset_index(drop=True)
        return {"metrics.csv": table}

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """curves.npz: the mean curves (layers, heads, n) and σ (NaN where not measured); bootstrap.npz: the
        replicates of the mean ranks (bootstrap, layers, heads, metric) when asked for."""
        missing = ~self.measured()[..., None]
        curves = {name: np.where(missing, np.nan, values) for name, values in (
            ("cum_mean", self.cum.mean), ("cum_std", self.cum.std), ("sigma_mean", self.sigma.mean),
            ("sigma_std", self.sigma.std))}
        found = {"curves.npz": {"index": np.arange(1, self.n + 1), **curves}}
        if self.bootstrap:
            with np.errstate(invalid="ignore", divide="ignore"):
                replicates = self.boot_total / self.boot_weight[..., None]
            found["bootstrap.npz"] = {"metrics": np.array(BOOTSTRAPPED), "replicates": replicates}
        return found
