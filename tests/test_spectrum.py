"""Spectra, curves and summaries against scipy/numpy computed independently in float64 (the probe that
streams them over a run: tests/probes/test_spectrum.py)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from references import spectrum_reference
from spectra.spectrum import SPECTRUM_METRICS as METRICS, cumulative, masked, resample, singular_values, summarize


def stochastic(batch: int, n: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    """Row-stochastic matrices: softmax of Gaussian logits."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(batch, n, n, generator=g), dim=-1)


@pytest.mark.parametrize("n", [16, 64, 200, 512])
def test_cumulative_curve_matches_scipy_to_1e5(n: int) -> None:
    p = stochastic(6, n, seed=n)
    sigma = singular_values(p)
    grid, metrics = summarize(sigma, torch.full((6,), n), at=n // 4, size=n)
    for b in range(6):
        ref_grid, ref_metrics = spectrum_reference(p[b].numpy(), n // 4, n)
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
        ref_grid, ref_metrics = spectrum_reference(block.numpy(), 12, n)
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
        ref, _ = spectrum_reference(p[b, :m, :m].numpy(), 64, n)
        assert np.abs(fast[b].numpy() - ref).max() < 5e-4
        assert np.abs(exact[b].numpy() - ref).max() < 1e-5


def test_masked_zeroes_padded_rows_and_columns() -> None:
    p = stochastic(2, 6, seed=1).reshape(1, 2, 6, 6)
    valid = torch.tensor([[True, True, True, True, False, False]])
    got = masked(p, valid)
    assert torch.equal(got[..., :4, :4], p[..., :4, :4])
    assert (got[..., 4:, :] == 0).all() and (got[..., :, 4:] == 0).all()
    sigma = singular_values(got)
    want = [scipy.linalg.svdvals(p[0, h, :4, :4].double().numpy()) for h in range(2)]
    assert np.allclose(sigma[0, :, :4].numpy(), want, atol=1e-12) and (sigma[0, :, 4:].abs() < 1e-12).all()


def test_cumulative_against_numpy() -> None:
    sigma = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    got = cumulative(sigma)
    assert np.allclose(got[0].numpy(), np.cumsum([3, 2, 1, 0]) / 6)
    assert torch.isfinite(got[1]).all()  # an all-zero spectrum does not divide by zero


def test_sink_and_entropy_on_left_and_right_padding() -> None:
    """The sink is the first valid key, wherever padding puts it; rows are counted from the first valid token."""
    from spectra.spectrum import row_metrics

    g = torch.Generator().manual_seed(4)
    n = 10
    p = torch.softmax(torch.randn(3, 2, n, n, generator=g) * 2, dim=-1)
    valid = torch.tensor([[True] * n, [False] * 3 + [True] * 7, [True] * 4 + [False] * 6])
    got = row_metrics(masked(p, valid), valid, start=2)
    for b in range(3):
        positions = valid[b].nonzero().flatten()
        for h in range(2):
            block = masked(p, valid)[b, h][positions][:, positions].double().numpy()
            begin = min(2, len(positions) - 1)
            assert got[b, h, 0].item() == pytest.approx(block[begin:, 0].mean())
            entropy = np.mean([-(row[row > 0] * np.log(row[row > 0])).sum() for row in block])
            assert got[b, h, 1].item() == pytest.approx(entropy)
