"""Per-sequence random projections and the cluster statistics of their success rates, against direct counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.probes.draws import Uncertainty, draw_seed
from spectra.seeds import Domain, derive_seed
from spectra.stats import ClusterStats, plain, wilson


def test_seeds_are_fixed_or_per_sequence_and_draw() -> None:
    assert draw_seed(3, Domain.THEOREM1, 1, 8, None, 0) == derive_seed(3, Domain.THEOREM1, 1, 8)
    per = {draw_seed(3, Domain.THEOREM1, 1, 8, sequence, draw) for sequence in range(4) for draw in range(3)}
    assert len(per) == 12, "every sequence and draw its own R"


def test_levels_count_each_sequence_once() -> None:
    """Two layers, two heads, three sequences: the per-head, per-layer and overall rates are the per-sequence means
    of the fractions of samples at most ε, each sequence weighted once."""
    g = torch.Generator().manual_seed(0)
    errors = {layer: torch.rand(2, 1, 1, 1, 3, 5, generator=g, dtype=torch.float64) for layer in range(2)}
    keep = torch.ones(3, 5)
    keep[2, 3:] = 0  # the third sequence has three real samples
    uncertainty = Uncertainty(2, 2, (1, 1), [0.5], draws=1)
    for layer, e in errors.items():
        uncertainty.add(layer, [7, 8, 9], e, keep)
    below = {layer: ((e[:, 0, 0, 0] <= 0.5) * keep).sum(-1).numpy() for layer, e in errors.items()}  # (H, B)
    count = keep.sum(-1).numpy()
    heads = uncertainty.columns(())
    assert np.allclose(heads["pr_mean"], [np.mean(below[layer][h] / count) for layer in range(2) for h in range(2)])
    layers = uncertainty.columns(("head",))
    assert np.allclose(layers["pr_mean"], [np.mean(below[layer].sum(0) / (2 * count)) for layer in range(2)])
    overall = uncertainty.columns(("layer", "head"))
    per_sequence = (below[0].sum(0) + below[1].sum(0)) / (4 * count)
    assert overall["pr_mean"] == pytest.approx([per_sequence.mean()]) and overall["sequences"][0] == 3
    fresh = Uncertainty(2, 2, (1, 1), [0.5], draws=1)
    fresh.load_state(plain(uncertainty.state("u")), "u")
    assert np.allclose(fresh.columns(())["pr_high"], heads["pr_high"])


def test_intervals() -> None:
    stats = ClusterStats((1,), [0.5], draws=2)
    below = torch.tensor([[[[1, 0, 1, 1], [1, 1, 0, 1]]]], dtype=torch.float64)  # (cell, eps, draw, cluster)
    stats.add((), below, torch.ones(4))
    mean, low, high = stats.interval()
    fractions = np.array([1.0, 0.5, 0.5, 1.0])
    half = 3.182446305284263 * fractions.std(ddof=1) / 2  # t(0.975, 3) · s / √4
    assert mean[0, 0] == pytest.approx(0.75) and low[0, 0] == pytest.approx(0.75 - half)
    assert high[0, 0] == pytest.approx(1.0), "clipped to [0, 1]"
    assert stats.draw_spread()[0, 0] == pytest.approx(np.std([0.75, 0.75], ddof=1))
    agreeing = ClusterStats((1,), [0.5])
    agreeing.add((), torch.ones(1, 1, 1, 5, dtype=torch.float64), torch.ones(5))
    assert agreeing.interval()[1][0, 0] == pytest.approx(wilson(np.array(1.0), np.array(5.0))[0]), \
        "every cluster agreed: Wilson's interval over clusters"
