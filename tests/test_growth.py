"""Growth exponents: exact on power laws and log n, recovered from synthetic spectra of known growth through
the spectrum probe, and a bootstrap interval that covers the true α."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from references import poisson_replicates

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
        probe.add(0, block_attention(int(n), count)[None, None].float(), torch.ones(1, int(n), dtype=torch.bool), [0])
        ranks.append(probe.metrics.mean[0, 0, METRICS.index("rank90")])
    assert ranks == [math.ceil(0.9 * count) for count in blocks]
    fit = growth(lengths, ranks)
    if law == "sqrt":
        assert fit.alpha == pytest.approx(alpha, abs=1e-12) and fit.better == "power"
    else:
        assert fit.better == "log" and fit.alpha < 0.35


@pytest.mark.parametrize("sequences", [4, 64])
@pytest.mark.parametrize("text", ["same", "different"])
def test_the_bootstrap_interval_covers_the_true_exponent(text, sequences) -> None:
    """Per-sequence ranks 4·n^0.7·exp(u_i + e_i,n), u_i the sequence's own level (the same text at every n, as in
    truncate mode) or none (different text at each n, as in pack mode), e_i,n noise: the mean rank grows exactly
    like n^0.7. Replicates are built as the spectrum probe builds them — sequence i weighted by Poisson draws
    seeded by its global index, the same at every n — and α's interval covers 0.7 in at least 90 of 100
    repetitions, also with as few as 4 sequences (where a percentile interval covers about 82 in 100)."""
    alpha, covered, widths = 0.7, 0, []
    for repetition in range(100):
        rng = np.random.default_rng(repetition)
        level = rng.normal(0, 0.3, (sequences, 1)) if text == "same" else 0.0
        noise = rng.normal(0, 0.3 if text == "same" else 0.42, (sequences, len(LENGTHS)))
        ranks = 4 * LENGTHS[None, :] ** alpha * np.exp(level + noise)  # (sequence, n)
        replicates = poisson_replicates(ranks, 200, seed=repetition)  # (replicate, n)
        fit = growth(LENGTHS, ranks.mean(0), replicates, sequences)
        covered += fit.alpha_low <= alpha <= fit.alpha_high
        widths.append(fit.alpha_high - fit.alpha_low)
        assert fit.alpha_low < fit.alpha < fit.alpha_high
    assert covered >= 90, covered
    assert 0 < np.mean(widths) < (0.9 if sequences == 4 else 0.15)


def test_the_interval_needs_sequences_and_whole_replicates() -> None:
    """Replicates without the number of sequences they resample are refused; a replicate missing a length (all its
    weights drawn 0 there) is left out rather than fitted on fewer lengths; one sequence gives no interval."""
    y = 3 * LENGTHS ** 0.5
    replicates = y * np.random.default_rng(0).lognormal(0, 0.05, (50, len(LENGTHS)))
    with pytest.raises(ValueError, match="number of sequences"):
        growth(LENGTHS, y, replicates)
    fit = growth(LENGTHS, y, replicates, 10)
    gapped = replicates.copy()
    gapped[7, 2] = np.nan
    wild = gapped.copy()
    wild[7, [0, 1, 3, 4]] = [1.0, 1e6, 1.0, 1e6]  # fitted on its four other lengths it would widen the interval
    assert growth(LENGTHS, y, wild, 10) == growth(LENGTHS, y, np.delete(replicates, 7, axis=0), 10)
    assert fit.alpha_low < 0.5 < fit.alpha_high
    assert math.isnan(growth(LENGTHS, y, replicates, 1).alpha_low)
