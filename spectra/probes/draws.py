"""Random projections drawn per sequence, and how sure the success rates measured over them are.

Theorems 1 and 2 are statements about a random projection R. Measured with one R for a whole run, a
success rate is a property of that one draw: twenty fresh draws moved a reported 0.040 anywhere in
0.026–0.064, and more sequences did not shrink that. So by default every sequence gets its own R (and E,
F), `draws` of them, seeded by (seed, domain, layer, budget, the sequence's global index, draw) so no
draw depends on batching or the number of processes; `fixed` keeps one R per (layer, budget),
the old behaviour.

`Uncertainty` turns the errors of a batch into cluster statistics at the three levels the theorem tables
report — per head, per layer (heads pooled) and over everything — with one cluster per sequence (its
draws, heads, layers and columns are correlated through its data and its R), so each rate gets a 95%
interval over sequences (`stats.ClusterStats`) and the spread of the rate across draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..seeds import derive_seed
from ..stats import ClusterStats, State

LEVELS = {(): "heads", ("head",): "layers", ("layer", "head"): "all"}


def draw_seed(seed: int, domain: int, layer: int, budget: int, sequence: int | None, draw: int) -> int:
    """The seed of one R: per (layer, budget) when `sequence` is None (fixed), else per sequence and draw too."""
    if sequence is None:
        return derive_seed(seed, domain, layer, budget)
    return derive_seed(seed, domain, layer, budget, sequence, draw)


class Uncertainty:
    """Cluster statistics (one cluster per sequence) per head, per layer and overall, for cells (K, V): budgets
    × variants, fed a layer at a time; the overall level waits until every layer of a batch has been seen."""

    def __init__(self, layers: int, heads: int, cells: tuple[int, int], eps: Sequence[float], draws: int) -> None:
        self.layers, self.heads, self.cells = layers, heads, cells
        self.stats = {"heads": ClusterStats((layers, heads, *cells), eps, draws),
                      "layers": ClusterStats((layers, *cells), eps, draws),
                      "all": ClusterStats(cells, eps, draws)}
        self.eps = torch.tensor(self.stats["all"].eps, dtype=torch.float64)
        self._pending: tuple[tuple[int, ...], torch.Tensor, torch.Tensor] | None = None

    def add(self, layer: int, index: Sequence[int], errors: torch.Tensor, keep: torch.Tensor) -> None:
        """errors (H, K, V, D, B, S) of one layer's batch (S samples per sequence), keep (B, S) the real ones."""
        errors = torch.nan_to_num(errors.detach().to("cpu", torch.float64), nan=float("inf"))
        keep = keep.to("cpu", torch.float64)
        below = ((errors[..., None] <= self.eps) * keep[..., None]).sum(-2)  # (H, K, V, D, B, E)
        below = below.movedim(-1, -3)  # (H, K, V, E, D, B)
        count = keep.sum(-1)  # (B,) samples per sequence and head
        self.stats["heads"].add(layer, below, count)
        self.stats["layers"].add(layer, below.sum(0), count * self.heads)
        index = tuple(index)
        if self._pending is not None and self._pending[0] != index:
            self.flush()
        if self._pending is None:
            self._pending = (index, torch.zeros_like(below[0]), torch.zeros_like(count))
        _, pending_below, pending_count = self._pending
        self._pending = (index, pending_below + below.sum(0), pending_count + count * self.heads)

    def flush(self) -> None:
        """Add the batch waiting for its last layer to the overall level."""
        if self._pending is not None:
            _, below, count = self._pending
            self.stats["all"].add((), below, count)
            self._pending = None

    def columns(self, pool: Sequence[str]) -> dict[str, np.ndarray]:
        """pr_mean (the mean over sequences of each sequence's rate), its 95% interval, the spread of the rate
        across draws, and the number of sequences: flat arrays in the order of the matching table's rows."""
        self.flush()
        stats = self.stats[LEVELS[tuple(pool)]]
        mean, low, high = stats.interval()
        return {"sequences": stats.clusters.reshape(-1), "pr_mean": mean.reshape(-1), "pr_low": low.reshape(-1),
                "pr_high": high.reshape(-1), "pr_draw_std": stats.draw_spread().reshape(-1)}

    def state(self, prefix: str) -> State:
        self.flush()
        return {key: value for level, stats in self.stats.items()
                for key, value in stats.state(f"{prefix}.{level}").items()}

    def load_state(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        for level, stats in self.stats.items():
            stats.load_state(arrays, f"{prefix}.{level}")
