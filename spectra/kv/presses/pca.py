"""Centred principal components of cached rows (keys before or after RoPE, values) per key/value head, the shared
piece of the spectral presses (loki, lowrank): streamed on calibration sequences, or taken from one context.

`Moments` streams, per layer and tensor, the float64 sums Σx, Σxᵀx and the row count N of every key/value head, so
the covariance (Σxᵀx − N μμᵀ)/N is that of the pooled rows whatever the order they arrive in (the centred
convention of Loki and of `pca_rank90` in qkv.csv). `principal` turns a covariance into its top directions;
`energy_rank` reads how many of them hold a share of the variance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Fit:
    """One tensor's centred statistics per key/value head: `mean` (H_kv, d), `covariance` (H_kv, d, d), float64."""

    mean: torch.Tensor
    covariance: torch.Tensor

    @classmethod
    def of(cls, rows: torch.Tensor) -> Fit:
        """The statistics of one context's rows (H_kv, L, d)."""
        moments = Moments()
        moments.add(0, "x", rows)
        return moments.fit(0, "x")

    def eigen(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Eigenvalues (H_kv, d), descending and clamped at 0, and their eigenvectors as columns (H_kv, d, d)."""
        values, vectors = torch.linalg.eigh(self.covariance)
        return values.flip(-1).clamp_min(0), vectors.flip(-1)


@dataclass
class Moments:
    """Per (layer, tensor name): Σx (H_kv, d), Σxᵀx (H_kv, d, d) and N in float64, added sequence by sequence."""

    sums: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, int]] = field(default_factory=dict)

    def add(self, layer: int, name: str, rows: torch.Tensor) -> None:
        """Add one sequence's rows (H_kv, L, d) of tensor `name` at `layer`."""
        x = rows.detach().to(torch.float64)
        total, second, count = self.sums.get((layer, name), (0.0, 0.0, 0))
        self.sums[(layer, name)] = (total + x.sum(dim=1), second + x.transpose(-1, -2) @ x, count + x.shape[1])

    def has(self, layer: int, name: str) -> bool:
        return (layer, name) in self.sums

    def fit(self, layer: int, name: str) -> Fit:
        """Mean and covariance of everything added for (layer, name)."""
        total, second, count = self.sums[(layer, name)]
        mean = total / count
        covariance = second / count - mean[..., :, None] * mean[..., None, :]
        return Fit(mean, (covariance + covariance.transpose(-1, -2)) / 2)

    def clear(self) -> None:
        self.sums.clear()

    def arrays(self) -> dict[str, np.ndarray]:
        """The sums as arrays named "<layer>|<name>|sum", "…|second", "…|count" (a checkpoint's, exactly)."""
        found = {}
        for (layer, name), (total, second, count) in sorted(self.sums.items()):
            found.update({f"{layer}|{name}|sum": total.numpy(), f"{layer}|{name}|second": second.numpy(),
                          f"{layer}|{name}|count": np.array(count, dtype=np.int64)})
        return found

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Replace the sums by those `arrays` holds (bitwise: float64 in, float64 out)."""
        self.sums.clear()
        for key in arrays:
            layer, name, part = key.split("|")
            if part == "count":
                self.sums[(int(layer), name)] = (torch.from_numpy(np.array(arrays[f"{layer}|{name}|sum"])),
                                                 torch.from_numpy(np.array(arrays[f"{layer}|{name}|second"])),
                                                 int(arrays[key]))


def energy_rank(eigenvalues: torch.Tensor, energy: float) -> torch.Tensor:
    """Smallest r whose top r eigenvalues (descending, (..., d)) hold `energy` of their sum, per leading index."""
    total = eigenvalues.cumsum(-1)
    share = total / total[..., -1:].clamp_min(torch.finfo(total.dtype).tiny)
    return ((share < energy).sum(-1) + 1).clamp_max(eigenvalues.shape[-1])


def principal(fit: Fit, rank: int) -> torch.Tensor:
    """The top `rank` centred principal directions (H_kv, d, rank), float64, orthonormal columns."""
    return fit.eigen()[1][..., :rank]


class MomentsCalibrated:
    """The calibration state of a press that fits on centred moments (loki, lowrank): `self.moments`, a fresh
    `Moments` per instance, which a run clears, checkpoints and restores through these three methods."""

    calibrates = True

    def __init__(self) -> None:
        self.moments = Moments()

    def clear(self) -> None:
        """Forget the calibration (a new run starts from none)."""
        self.moments.clear()

    def statistics(self) -> dict[str, np.ndarray]:
        return self.moments.arrays()

    def load_statistics(self, arrays: dict[str, np.ndarray]) -> None:
        self.moments.load(arrays)
