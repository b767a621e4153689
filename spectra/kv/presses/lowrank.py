"""`lowrank`: every cached key and value replaced by its projection on a few centred principal directions of its
head (Palu / Eigen Attention: store r coefficients per token instead of d numbers), the ranks chosen from the
spectrum.

Per layer and key/value head, the keys (post-RoPE, as cached) and the values have a mean μ and a covariance fitted on
calibration sequences (`calibrate`, float64 sums over every calibration token, `pca.Moments`); a press that has seen
no calibration sequence for a layer fits them on the context itself (an oracle: the basis then costs memory too).
`spectra cache --fit-samples N` calibrates on its first N sequences and freezes the fit (means, covariances, hence
the bases and the ranks) for the evaluated ones; with N = 0 (the default) every context takes that oracle.
Ratio r removes the share r of the layer's cached numbers: the layer keeps B = round((1 − r)·2·d·H_kv) principal
directions in all, shared among its keys and values of every head by the spectrum — the B largest of the
eigenvalues each divided by its own covariance's trace (the share of a tensor's variance a direction explains), so a
head whose keys live in 3 directions gives its dimensions to one whose values need 40. Each row x becomes
μ + P Pᵀ (x − μ) with P the chosen directions of its tensor and head (a head given none keeps μ). Every token stays;
`saved` is 1 − B/(2·d·H_kv), the share of coefficients dropped (the mean and basis, fitted once, are not counted).
`stored` counts the bytes per key/value head: its r_K + r_V coefficients per token, and, when the fit is the
context's own (no calibration), the r directions and the mean (d numbers) of each tensor too, which that cache
cannot do without; a calibrated basis is the model's, shared by every sequence, and not counted.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Press, register
from .pca import Fit, MomentsCalibrated

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 50

TENSORS = ("key", "value")


def allocate(eigenvalues: torch.Tensor, budget: int) -> torch.Tensor:
    """Ranks (T, H_kv) for descending eigenvalues (T, H_kv, d) of T tensors: the `budget` largest eigenvalues, each
    relative to its own row's sum, counted per row (ties go to the earlier tensor, head and direction)."""
    share = eigenvalues / eigenvalues.sum(-1, keepdim=True).clamp_min(torch.finfo(eigenvalues.dtype).tiny)
    flat = share.flatten()
    order = torch.sort(-flat, stable=True).indices[:budget]
    chosen = torch.zeros_like(flat, dtype=torch.bool)
    chosen[order] = True
    return chosen.view(share.shape).sum(-1)


def reconstruct(rows: torch.Tensor, fit: Fit, vectors: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """rows (H_kv, L, d) → μ + P Pᵀ (x − μ) per head, P the first `rank[h]` columns of `vectors` (H_kv, d, d)."""
    inside = torch.arange(vectors.shape[-1], device=rows.device)[None, :] < rank[:, None]
    basis = vectors * inside[:, None, :]  # unused directions zeroed
    centred = rows.to(torch.float64) - fit.mean[:, None, :]
    projected = centred @ basis @ basis.transpose(-1, -2) + fit.mean[:, None, :]
    return projected.to(rows.dtype)


@register
class LowRank(MomentsCalibrated, Press):
    """Keys and values on their top centred principal directions per head, ranks shared by the spectrum."""

    name, summary = "lowrank", "keys and values on their top principal directions, ranks set by the spectrum"
    peer = ""
    axis = "rank"

    def calibrate(self, prefill: Prefill) -> None:
        self.moments.add(prefill.layer, "key", prefill.key)
        self.moments.add(prefill.layer, "value", prefill.value)

    def fits(self, prefill: Prefill) -> list[Fit]:
        """The key and value statistics of this layer: the calibration's, else the context's own."""
        return [self.moments.fit(prefill.layer, name) if self.moments.has(prefill.layer, name)
                else Fit.of(getattr(prefill, name)) for name in TENSORS]

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        fits = self.fits(prefill)
        eigen = [fit.eigen() for fit in fits]
        total = 2 * prefill.head_dim * prefill.kv_heads
        budget = round((1 - ratio) * total)
        ranks = allocate(torch.stack([values for values, _ in eigen]), budget)
        key, value = (reconstruct(getattr(prefill, name), fit, vectors, rank)
                      for name, fit, (_, vectors), rank in zip(TENSORS, fits, eigen, ranks))
        every = torch.arange(prefill.length, device=prefill.key.device).expand(prefill.kv_heads, -1)
        return Compressed(every, 1 - budget / total, key=key, value=value, stored=self.stored(prefill, ranks))

    def stored(self, prefill: Prefill, ranks: torch.Tensor) -> torch.Tensor:
        """(H_kv,) bytes: the coefficients of each head's keys and values (`ranks` (2, H_kv)), with the basis and
        mean of each tensor fitted on the context itself (see the module docstring)."""
        itemsize, dim = prefill.key.element_size(), prefill.head_dim
        numbers = ranks.sum(0).to(torch.int64) * prefill.length
        for name, rank in zip(TENSORS, ranks):
            if not self.moments.has(prefill.layer, name):
                numbers = numbers + rank.to(torch.int64) * dim + dim
        return numbers * itemsize
