"""Spectra, curves and summaries against scipy/numpy computed independently in float64."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from spectra.spectrum import METRICS, SpectrumProbe, resample, singular_values, summarize
from spectra.stats import Moments


def stochastic(batch: int, n: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    """Row-stochastic matrices: softmax of Gaussian logits."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(batch, n, n, generator=g), dim=-1)


def reference(p: np.ndarray, at: int, size: int) -> tuple[np.ndarray, dict[str, float]]:
    """Curve on the relative grid and METRICS of one m×m matrix, in float64 with scipy."""
    m = p.shape[0]
    sigma = scipy.linalg.svdvals(p.astype(np.float64))
    cum = np.cumsum(sigma) / sigma.sum()
    grid = np.interp(np.arange(1, size + 1) / size, np.arange(0, m + 1) / m, np.concatenate([[0.0], cum]))
    share = sigma / sigma.sum()
    share = share[share > 0]
    metrics = {
        "sigma1": sigma[0],
        "nuclear": sigma.sum(),
        "stable_rank": np.linalg.norm(p, "fro") ** 2 / np.linalg.norm(p, 2) ** 2,
        "erank": np.exp(-(share * np.log(share)).sum()),
        "rank90": next(i + 1 for i, c in enumerate(cum) if c >= 0.9),
        "rank99": next(i + 1 for i, c in enumerate(cum) if c >= 0.99),
        "c_at": grid[at - 1],
        "length": m,
    }
    return grid, metrics


@pytest.mark.parametrize("n", [16, 64, 200, 512])
def test_cumulative_curve_matches_scipy_to_1e5(n: int) -> None:
    p = stochastic(6, n, seed=n)
    sigma = singular_values(p)
    grid, metrics = summarize(sigma, torch.full((6,), n), at=n // 4, size=n)
    for b in range(6):
        ref_grid, ref_metrics = reference(p[b].numpy(), n // 4, n)
        assert np.abs(grid[b].numpy() - ref_grid).max() < 1e-5
        for i, name in enumerate(METRICS):
            assert metrics[b, i].item() == pytest.approx(ref_metrics[name], rel=1e-4, abs=1e-5), name


def test_padded_block_equals_its_own_spectrum() -> None:
    """A zero-padded n×n matrix gives the m×m block's curve resampled on j/n and its metrics."""
    n, lengths = 48, [48, 30, 7]
    blocks = [stochastic(1, m, seed=m)[0] for m in lengths]
    p = torch.zeros(len(lengths), n, n)
    for b, block in enumerate(blocks):
        p[b, : lengths[b], : lengths[b]] = block
    grid, metrics = summarize(singular_values(p), torch.tensor(lengths), at=12, size=n)
    for b, block in enumerate(blocks):
        ref_grid, ref_metrics = reference(block.numpy(), 12, n)
        assert np.abs(grid[b].numpy() - ref_grid).max() < 1e-5
        assert metrics[b, METRICS.index("rank90")].item() == ref_metrics["rank90"]
        assert metrics[b, METRICS.index("length")].item() == lengths[b]


def test_resample_is_identity_at_full_length_and_linear_otherwise() -> None:
    cum = torch.rand(3, 10, dtype=torch.float64).sort(dim=-1).values
    cum[:, -1] = 1.0
    assert torch.equal(resample(cum, torch.full((3,), 10), 10), cum)
    short = cum.clone()
    short[:, 4:] = 1.0
    got = resample(short, torch.full((3,), 4), 10)
    for b in range(3):
        want = np.interp(np.arange(1, 11) / 10, np.arange(0, 5) / 4, np.concatenate([[0.0], short[b, :4].numpy()]))
        assert np.allclose(got[b].numpy(), want, atol=1e-12)


def test_moments_match_numpy_mean_and_std() -> None:
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(37, 3, 5))
    moments = Moments.zeros((2, 3, 5))
    for chunk in np.array_split(samples, 4):
        moments.add(1, torch.from_numpy(chunk))
    assert np.allclose(moments.mean[1], samples.mean(0), atol=1e-12)
    assert np.allclose(moments.std[1], samples.std(0), atol=1e-12)
    assert (moments.count[1] == 37).all() and (moments.count[0] == 0).all()


def test_probe_streams_layers_heads_and_padding() -> None:
    """Probe averages over sequences per (layer, head), reading lengths off the additive mask."""
    n, heads, lengths = 20, 2, [20, 13]
    probe = SpectrumProbe(layers=2, heads=heads, n=n, at=5)
    mask = torch.zeros(2, 1, n, n)
    mask[1, ..., 13:] = torch.finfo(torch.float32).min
    p = torch.softmax(torch.randn(2, heads, n, n, generator=torch.Generator().manual_seed(1)) * 2 + mask, dim=-1)
    probe.update(1, None, None, None, mask, p, scaling=1.0)
    for h in range(heads):
        refs = [reference(p[b, h, : lengths[b], : lengths[b]].numpy(), 5, n) for b in range(2)]
        want = np.mean([r[0] for r in refs], axis=0)
        assert np.abs(probe.cum.mean[1, h] - want).max() < 1e-5
        want_rank = np.mean([r[1]["rank90"] for r in refs])
        assert probe.metrics.mean[1, h, METRICS.index("rank90")] == pytest.approx(want_rank)
    assert (probe.cum.count[0] == 0).all()


@pytest.mark.parametrize("scale", [0.0, 0.01, 0.3, 1.0, 10.0])
def test_fast_mode_matches_scipy(scale: float) -> None:
    """The float32 Gram route with its exact fallback keeps c within 5e-4, near-uniform P included."""
    n = 256
    p = stochastic(3, n, seed=7, scale=scale)
    p[2, :, 200:] = 0  # a padded sequence: zero key columns and query rows
    p[2, 200:, :] = 0
    lengths = torch.tensor([n, n, 200])
    exact, _ = summarize(singular_values(p, "exact"), lengths, at=64, size=n)
    fast, _ = summarize(singular_values(p, "fast"), lengths, at=64, size=n)
    for b, m in enumerate(lengths.tolist()):
        ref, _ = reference(p[b, :m, :m].numpy(), 64, n)
        assert np.abs(fast[b].numpy() - ref).max() < 5e-4
        assert np.abs(exact[b].numpy() - ref).max() < 1e-5
