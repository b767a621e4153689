"""Growth exponents: exact on power laws and log n, recovered from synthetic spectra of known growth through
the spectrum probe, and a bootstrap interval that covers the true α."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectra.growth import growth, log_fit, power_fit
from spectra.probes.spectrum import SpectrumProbe
from spectra.spectrum import METRICS

LENGTHS = np.array([64, 128, 256, 512, 1024])


def test_exact_power_law_and_exact_log_growth() -> None:
    fit = growth(LENGTHS, 3 * LENGTHS ** 0.5)
    assert fit.alpha == pytest.approx(0.5) and fit.scale == pytest.approx(3)
    assert fit.rmse_power < 1e-12 < fit.rmse_log and fit.better == "power"
    logarithmic = growth(LENGTHS, 2 + 5 * np.log(LENGTHS))
    assert (logarithmic.log_a, logarithmic.log_b) == (pytest.approx(2), pytest.approx(5))
    assert logarithmic.rmse_log < 1e-12 < logarithmic.rmse_power and logarithmic.better == "log"
    assert 0 < logarithmic.alpha < 0.3, "log n looks like a small exponent over these lengths"
    assert growth(LENGTHS, np.full(5, 7.0)).alpha == pytest.approx(0, abs=1e-12)
    assert math.isnan(power_fit([64, 64], [1, 2])[0]) and math.isnan(log_fit([64], [1])[1])
    assert math.isnan(growth(LENGTHS, np.zeros(5)).alpha), "no positive value, no exponent"
    linear = growth(LENGTHS, 0.4 * LENGTHS)  # the least-squares a + b·log n goes below 0 at n = 64: cannot fit
    a, b = log_fit(LENGTHS, 0.4 * LENGTHS)
    assert a + b * math.log(64) < 0 and linear.rmse_log == math.inf and linear.better == "power"


def block_attention(n: int, blocks: int) -> torch.Tensor:
    """A row-stochastic P of `blocks` uniform diagonal blocks: `blocks` singular values equal to 1, the rest 0,
    so the rank holding 90% of its nuclear norm is ⌈0.9·blocks⌉."""
    edges = np.linspace(0, n, blocks + 1).round().astype(int)
    p = torch.zeros(n, n, dtype=torch.float64)
    for low, high in zip(edges[:-1], edges[1:]):
        p[low:high, low:high] = 1.0 / (high - low)
    return p


@pytest.mark.parametrize("law, alpha", [("sqrt", 0.5), ("log", None)])
def test_the_exponent_of_synthetic_spectra_of_known_growth(law, alpha) -> None:
    """Spectra whose needed rank grows like √n (or log n) by construction, measured by the analyze probe."""
    if law == "sqrt":  # ⌈0.9·(9, 19, 39)⌉ = 9, 18, 36 = 9·√(n/64)
        lengths, blocks = np.array([64, 256, 1024]), [9, 19, 39]
    else:  # ⌈0.9·(5·log₂ n + 1)⌉
        lengths = LENGTHS[:4]
        blocks = [int(5 * math.log2(n)) + 1 for n in lengths]
    ranks = []
    for n, count in zip(lengths, blocks):
        probe = SpectrumProbe(layers=1, heads=1, n=int(n), at=int(n) // 4)
        probe.add(0, block_attention(int(n), count)[None, None].float(), torch.ones(1, int(n), dtype=torch.bool))
        ranks.append(probe.metrics.mean[0, 0, METRICS.index("rank90")])
    assert ranks == [math.ceil(0.9 * count) for count in blocks]
    fit = growth(lengths, ranks)
    if law == "sqrt":
        assert fit.alpha == pytest.approx(alpha, abs=1e-12) and fit.better == "power"
    else:
        assert fit.better == "log" and fit.alpha < 0.35


def test_the_bootstrap_interval_covers_the_true_exponent() -> None:
    """Per-sequence ranks c·n^0.5·LogNormal(0, 0.3): the mean grows exactly like n^0.5; the percentile interval
    over Poisson-bootstrap replicates of the means covers 0.5 in at least 90 of 100 repetitions."""
    covered, widths = 0, []
    for repetition in range(100):
        rng = np.random.default_rng(repetition)
        ranks = 4 * LENGTHS[None, :] ** 0.5 * rng.lognormal(0, 0.3, size=(40, len(LENGTHS)))  # (sequence, n)
        weights = rng.poisson(1.0, size=(200, 40, len(LENGTHS)))
        replicates = (weights * ranks).sum(1) / weights.sum(1)
        fit = growth(LENGTHS, ranks.mean(0), replicates)
        covered += fit.alpha_low <= 0.5 <= fit.alpha_high
        widths.append(fit.alpha_high - fit.alpha_low)
        assert fit.alpha_low <= fit.alpha <= fit.alpha_high
    assert covered >= 90, covered
    assert 0 < np.mean(widths) < 0.1
