"""Query, key and value spectra per layer and head: how many directions of the head dimension they use.

Low-rank-key studies ask this of the d-dimensional rows of K (n × d), not of P. Per sequence and head,
the singular values of the valid rows of Q, K (per key/value head under grouped-query attention) and V
give the smallest rank reaching 90% and 99% of the energy Σσ²; streamed over the whole run, the d × d
second-moment matrix Σ xᵀx of each layer and head gives, through its eigenvalues, the dataset-level rank
at 90% / 99% of the energy Σxᵀx about zero (uncentred: the mean counts; not the variance, see below).

Loki, Palu and the other head-dimension papers use the centred convention instead (PCA): the rows pooled over
every token of the run, their mean removed, eigenvalues of the covariance. The probe streams the row sums Σx and
the token count N beside Σxᵀx, all in float64, and forms Σ(x − μ)ᵀ(x − μ) = Σxᵀx − N μμᵀ at the end, so the
centred ranks (`pca_rank90`, `pca_rank99`) are those of the pooled rows whatever the batching, and states still add
across processes. The subtraction cancels the mean's share of the energy: in float64 the covariance keeps about
16 − log10(‖Σxᵀx‖ / ‖covariance‖) digits, ample for keys whose mean carries 10–1000× their variance. The
difference matters: a key mean far from zero is one direction holding most of the uncentred energy, so the
uncentred rank is small while the centred one, what a PCA basis must keep, is several times larger.

For a model with rotary position embeddings (RoPE) queries and keys are measured twice: at the
"projection" stage (the output of W^Q, W^K, before RoPE; `models.watch_projections`) and at the
"attention" stage (what the attention function receives). Values are not rotated: one stage. A model
without RoPE has the attention stage only. Results: `qkv.csv` (one row per tensor, stage, layer, head)
and `qkv.npz` (the eigenvalues of every second-moment matrix Σxᵀx and covariance matrix, descending, and
`tokens`, the rows N pooled per layer: N · Σ covariance eigenvalues / Σ second-moment eigenvalues is the share of
the energy the mean does not hold).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..errors import SpectraError
from ..models import rotary, watch_projections
from ..spectrum import split_threads
from ..stats import Moments, State, tagged
from .base import Probe

ENERGIES = (0.9, 0.99)
PROJECTION, ATTENTION = "projection", "attention"


def gram(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """XᵀX (B, H, d, d) in float64 of each sequence's valid rows (padded rows zeroed): its eigenvalues are σ²."""
    rows = x.to(torch.float64) * valid[:, None, :, None]
    return torch.einsum("bhnd,bhne->bhde", rows, rows)


def energy_ranks(grams: torch.Tensor) -> torch.Tensor:
    """Smallest r with Σ_{i≤r} σ_i² ≥ E·Σσ² for each E in ENERGIES, from Gram matrices (B, H, d, d) → (B, H, 2).

    σ² are the Gram matrix's eigenvalues (float64), so padded rows, which add zeros, leave the ranks alone."""
    squares = torch.cat(split_threads(torch.linalg.eigvalsh, grams)).reshape(grams.shape[:-1]).flip(-1).clamp_min(0)
    energy = squares.cumsum(-1)
    share = energy / energy[..., -1:].clamp_min(torch.finfo(energy.dtype).tiny)
    return torch.stack([(share < e).sum(-1) + 1 for e in ENERGIES], dim=-1).to(torch.float64)


def spectrum_ranks(eigenvalues: np.ndarray) -> np.ndarray:
    """Smallest r whose top eigenvalues explain E of the total, for E in ENERGIES: (..., d) descending → (..., 2)."""
    total = np.maximum(eigenvalues.cumsum(-1), 0.0)
    share = total / np.maximum(total[..., -1:], np.finfo(float).tiny)
    return np.stack([(share < e).sum(-1) + 1 for e in ENERGIES], axis=-1)


def centred_eigenvalues(second: np.ndarray, sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Descending eigenvalues (..., d) of the covariance (Σxᵀx − N μμᵀ) / N, μ = Σx / N, of N pooled rows, from
    their float64 second moment `second` (..., d, d), row sum `sums` (..., d) and count (broadcast to ...)."""
    count = np.maximum(np.asarray(count, dtype=np.float64), 1.0)[..., None, None]
    covariance = (second - sums[..., :, None] * sums[..., None, :] / count) / count
    covariance = (covariance + np.swapaxes(covariance, -1, -2)) / 2
    return np.linalg.eigvalsh(covariance)[..., ::-1].clip(min=0)


class QKVProbe(Probe):
    """Per-sequence energy ranks and streamed second moments of Q, K, V for every layer and head.

    `model` is hooked for the projection stage when it uses RoPE (`close()` removes the hooks)."""

    def __init__(self, model: torch.nn.Module, layers: int, heads: int, kv_heads: int, d: int) -> None:
        self.layers, self.d = layers, d
        self.rope = rotary(model)
        self.cells = {("q", ATTENTION): heads, ("k", ATTENTION): kv_heads, ("v", ATTENTION): kv_heads}
        if self.rope:
            self.cells.update({("q", PROJECTION): heads, ("k", PROJECTION): kv_heads})
        self.ranks = {cell: Moments.zeros((layers, count, len(ENERGIES))) for cell, count in self.cells.items()}
        self.second = {cell: np.zeros((layers, count, d, d)) for cell, count in self.cells.items()}
        self.sums = {cell: np.zeros((layers, count, d)) for cell, count in self.cells.items()}
        self.tokens = np.zeros(layers)
        self._projected: dict[tuple[int, str], torch.Tensor] = {}
        self._handles = watch_projections(model, self._keep) if self.rope else []

    def _keep(self, layer: int, which: str, output: torch.Tensor) -> None:
        if which in ("q", "k"):
            self._projected[(layer, which)] = output.detach()

    def _add(self, cell: tuple[str, str], layer: int, x: torch.Tensor, valid: torch.Tensor) -> None:
        grams = gram(x, valid)
        self.ranks[cell].add(layer, energy_ranks(grams))
        self.second[cell][layer] += grams.sum(0).cpu().numpy()
        rows = x.to(torch.float64) * valid[:, None, :, None]
        self.sums[cell][layer] += rows.sum((0, 2)).cpu().numpy()

    def update(self, captured: Captured) -> None:
        layer, valid = captured.layer, captured.valid
        self.tokens[layer] += float(valid.sum())
        for which, x in (("q", captured.q), ("k", captured.key), ("v", captured.value)):
            self._add((which, ATTENTION), layer, x, valid)
            projected = self._projected.pop((layer, which), None)
            if projected is not None and (which, PROJECTION) in self.cells:
                heads = self.cells[(which, PROJECTION)]
                batch, n, _ = projected.shape
                self._add((which, PROJECTION), layer, projected.view(batch, n, heads, -1).transpose(1, 2), valid)

    def state(self) -> State:
        state: State = {}
        for (which, stage), moments in self.ranks.items():
            state.update(moments.state(f"qkv.{which}.{stage}.ranks"))
            state.update(tagged({f"qkv.{which}.{stage}.second": self.second[(which, stage)],
                                 f"qkv.{which}.{stage}.sums": self.sums[(which, stage)]}))
        state.update(tagged({"qkv.tokens": self.tokens}))
        return state

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        if "qkv.tokens" not in arrays:
            raise SpectraError("the checkpoint was written by an older spectra without the centred key sums; start "
                               "the run over (--overwrite)")
        for which, stage in self.cells:
            self.ranks[(which, stage)] = Moments.from_arrays(arrays, f"qkv.{which}.{stage}.ranks")
            self.second[(which, stage)] = np.array(arrays[f"qkv.{which}.{stage}.second"])
            self.sums[(which, stage)] = np.array(arrays[f"qkv.{which}.{stage}.sums"])
        self.tokens = np.array(arrays["qkv.tokens"])

    def eigenvalues(self) -> dict[tuple[str, str], np.ndarray]:
        """Descending eigenvalues (layers, heads, d) of every second-moment matrix."""
        return {cell: np.linalg.eigvalsh(matrix)[..., ::-1].clip(min=0) for cell, matrix in self.second.items()}

    def covariance_eigenvalues(self) -> dict[tuple[str, str], np.ndarray]:
        """Descending eigenvalues (layers, heads, d) of the covariance of each cell's rows pooled over the run."""
        counts = self.tokens[:, None]
        return {cell: centred_eigenvalues(second, self.sums[cell], counts) for cell, second in self.second.items()}

    def tables(self) -> dict[str, pd.DataFrame]:
        """qkv.csv: per (tensor, stage, layer, head): sequences, mean and std of the per-sequence ranks for 90% and
        99% of the energy, the dataset-level ranks for 90% and 99% of the energy Σxᵀx (uncentred: dataset_rank*),
        the centred (PCA) ranks for 90% and 99% of the covariance's trace over the run's pooled rows; d."""
        frames = []
        centred = self.covariance_eigenvalues()
        for (which, stage), eigenvalues in self.eigenvalues().items():
            moments, heads = self.ranks[(which, stage)], self.cells[(which, stage)]
            layer, head = np.meshgrid(np.arange(self.layers), np.arange(heads), indexing="ij")
            dataset, pca = spectrum_ranks(eigenvalues), spectrum_ranks(centred[(which, stage)])
            frames.append(pd.DataFrame({
                "tensor": which, "stage": stage, "layer": layer.ravel(), "head": head.ravel(),
                "sequences": moments.count.ravel().astype(np.int64),
                "rank90_mean": moments.mean[..., 0].ravel(), "rank90_std": moments.std[..., 0].ravel(),
                "rank99_mean": moments.mean[..., 1].ravel(), "rank99_std": moments.std[..., 1].ravel(),
                "dataset_rank90": dataset[..., 0].ravel(), "dataset_rank99": dataset[..., 1].ravel(),
                "d": self.d, "pca_rank90": pca[..., 0].ravel(), "pca_rank99": pca[..., 1].ravel(),
            }))
        return {"qkv.csv": pd.concat(frames, ignore_index=True)}

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        centred = {f"{which}_{stage}_pca_eigenvalues": values
                   for (which, stage), values in self.covariance_eigenvalues().items()}
        return {"qkv.npz": {**{f"{which}_{stage}_eigenvalues": values
                               for (which, stage), values in self.eigenvalues().items()}, **centred,
                            "tokens": self.tokens.copy()}}

    def describe(self) -> dict:
        return {"qkv": True, "rope": self.rope}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
