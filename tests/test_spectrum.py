"""Spectra, curves and summaries against scipy/numpy computed independently in float64 (the probe that
streams them over a run: tests/probes/test_spectrum.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import scipy.linalg
import tiny
import torch
from references import spectrum_reference
from transformers import AutoModel, AutoTokenizer

from spectra import capture
from spectra.lapack import Workspace
from spectra.spectrum import (
    EXACT_TOLERANCE,
    cumulative,
    each_matrix,
    gram_loss,
    masked,
    resample,
    row_metrics,
    singular_values,
    singular_values_routed,
    split_threads,
    summarize,
    torch_sigma,
)
from spectra.spectrum import SPECTRUM_METRICS as METRICS

#: the two implementations of the exact route: the CPU's (one matrix per thread through spectra.lapack) and the
#: batched torch one that GPUs take (run here on CPU tensors)
ROUTES = {"lapack": singular_values, "torch": lambda p: torch_sigma(p.reshape(-1, *p.shape[-2:]))[0].reshape(
    *p.shape[:-2], -1), "cuda": lambda p: singular_values(p.cuda()).cpu()}
#: the routes as test parameters: the GPU's own (the torch route on CUDA tensors) only where a GPU is
ROUTE_PARAMETERS = ["lapack", "torch", pytest.param("cuda", marks=pytest.mark.cuda)]

pytestmark = pytest.mark.threads  # the spectra run as users get them: split_threads' pool over the machine's cores


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


def softmax_block(n: int, m: int, scale: float, seed: int) -> torch.Tensor:
    """An n×n attention matrix whose valid m×m block is the softmax of Gaussian logits times `scale` (float32,
    as captured); padded rows and columns are zero."""
    p = torch.zeros(n, n)
    p[:m, :m] = stochastic(1, m, seed=seed, scale=scale)[0]
    return p


def scipy_curve(block: np.ndarray, n: int) -> np.ndarray:
    """c (n) of the block's float64 scipy singular values followed by zeros."""
    sigma = np.concatenate([scipy.linalg.svdvals(block.astype(np.float64)), np.zeros(n - block.shape[0])])
    return np.cumsum(sigma) / sigma.sum()


@pytest.mark.parametrize("route", ROUTE_PARAMETERS)
@pytest.mark.parametrize("n", [16, 128, 512])
@pytest.mark.parametrize("scale", [0.0, 1e-3, 0.01, 0.1, 1.0, 3.0, 10.0, 100.0])
def test_exact_mode_within_1e6_of_scipy_at_every_temperature(n: int, scale: float, route: str) -> None:
    """From exactly uniform P (scale 0) to near one-hot P (scale 100), full and padded, the exact mode's c is
    within 1e-6 of float64 scipy, and the padded values are exact zeros, on either route."""
    lengths = [n, n, n - n // 4, n // 2 + 1]
    p = torch.stack([softmax_block(n, m, scale, seed=7 * n + b) for b, m in enumerate(lengths)])
    sigma = ROUTES[route](p)
    assert sigma.dtype == torch.float64
    for b, m in enumerate(lengths):
        want = scipy_curve(p[b, :m, :m].numpy(), n)
        assert np.abs(cumulative(sigma[b]).numpy() - want).max() <= 1e-6
        assert (sigma[b, m:] == 0).all()
        assert (sigma[b, :-1] >= sigma[b, 1:]).all()


@pytest.mark.parametrize("route", ROUTE_PARAMETERS)
@pytest.mark.parametrize("n", [16, 128, 512])
def test_exact_mode_on_rank_deficient_p(n: int, route: str) -> None:
    """Repeated rows (rank n/4 and rank 2; hence many zero singular values) stay within 1e-6 of scipy."""
    g = torch.Generator().manual_seed(n)
    p = torch.stack([
        torch.softmax(3 * torch.randn(n // 4, n, generator=g), -1).repeat_interleave(4, 0),
        torch.softmax(3 * torch.randn(2, n, generator=g), -1).repeat(n // 2, 1),
        torch.softmax(100 * torch.randn(n, n, generator=g), -1)[torch.arange(n) % 3],  # near one-hot, rank 3
    ])
    sigma = ROUTES[route](p)
    for b in range(p.shape[0]):
        assert np.abs(cumulative(sigma[b]).numpy() - scipy_curve(p[b].numpy(), n)).max() <= 1e-6


def lapack_eigenvalues(p: torch.Tensor) -> np.ndarray:
    """Ascending eigenvalues (b, n) of each float64 PᵀP as the CPU route computes them (dsyrk, dsyevd)."""
    space = Workspace(p.shape[-1])
    return np.stack([space.gram_eigenvalues(a).copy() for a in p.numpy()])


def torch_eigenvalues(p: torch.Tensor) -> np.ndarray:
    """Ascending eigenvalues (b, n) of each float64 PᵀP as the torch route computes them."""
    p = p.double()
    return torch.cat(split_threads(torch.linalg.eigvalsh, p.mT @ p)).numpy()


EIGENVALUES = {"lapack": lapack_eigenvalues, "torch": torch_eigenvalues}


@pytest.mark.parametrize("route", sorted(EIGENVALUES))
@pytest.mark.parametrize("scale", [0.0, 1e-6, 1e-4, 1e-2, 1.0, 3.0, 10.0, 100.0])
def test_gram_loss_bounds_the_gram_routes_actual_error(scale: float, route: str) -> None:
    """The bound `gram_loss` puts on |Δc| of √eig(float64 PᵀP) is never below the error actually made, with
    the eigenvalues of either route."""
    n = 128
    p = stochastic(6, n, seed=11, scale=scale)
    eigenvalues = EIGENVALUES[route](p)
    bound = gram_loss(eigenvalues)
    got = cumulative(torch.from_numpy(np.sqrt(np.maximum(eigenvalues, 0))[:, ::-1].copy()))
    for b in range(p.shape[0]):
        actual = np.abs(got[b].numpy() - scipy_curve(p[b].numpy(), n)).max()
        assert actual <= bound[b]


def test_exact_fallback_triggers_on_near_uniform_p_only() -> None:
    """The decision: near-uniform P (tiny singular values that squaring loses) goes to the SVD, peaked P does
    not, per matrix: in a mixed batch only the near-uniform ones fall back."""
    for n in (128, 512):
        uniform = torch.stack([stochastic(1, n, seed=1, scale=s)[0] for s in (0.0, 1e-6, 1e-5)])
        peaked = torch.stack([stochastic(1, n, seed=2, scale=s)[0] for s in (0.3, 1.0, 3.0, 10.0)])
        for batch, hard in ((uniform, True), (peaked, False)):
            for eigenvalues in (lapack_eigenvalues(batch), torch_eigenvalues(batch)):
                assert ((gram_loss(eigenvalues) > EXACT_TOLERANCE) == hard).all()
        mixed = torch.cat([peaked[:2], uniform[:1], peaked[2:], uniform[1:]])
        sigma, fell_back = singular_values_routed(mixed.reshape(1, 7, n, n))
        assert fell_back.shape == (1, 7) and fell_back[0].tolist() == [False, False, True, False, False, True, True]
        assert torch.equal(sigma, singular_values(mixed.reshape(1, 7, n, n)))
        assert torch_sigma(mixed)[1].tolist() == fell_back[0].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("n", [128, 512])
def test_exact_mode_within_1e6_of_scipy_on_real_attention(n: int) -> None:
    """Every head's P of the real all-MiniLM-L6-v2 on licence text (one full block of n tokens, and a padded
    copy of its first 0.6·n): the exact mode's c is within 1e-6 of float64 scipy on every matrix."""
    folder = tiny.minilm()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(tiny.licence_text(), add_special_tokens=False, return_tensors="pt")["input_ids"][:, :n]
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, int(0.6 * n):] = 0
    model = AutoModel.from_pretrained(folder, attn_implementation=capture.NAME).eval()
    seen = []
    with torch.no_grad(), capture.capturing(lambda record: seen.append(masked(record.p, record.valid))):
        model(input_ids=ids.repeat(2, 1), attention_mask=mask)
    p = torch.cat(seen, dim=1)  # (2, layers × heads, n, n)
    sigma = singular_values(p)
    for b, m in enumerate((n, int(0.6 * n))):
        for h in range(p.shape[1]):
            want = scipy_curve(p[b, h, :m, :m].numpy(), n)
            assert np.abs(cumulative(sigma[b, h]).numpy() - want).max() <= 1e-6, (b, h)


def test_threads_and_inputs_do_not_change_the_numbers() -> None:
    """Same σ bitwise on one thread and on several (a same-process promise), from float32 or float64, from a
    strided batch, inside inference mode; rectangular blocks give min(r, m) values; an empty batch gives none."""
    p = torch.stack([softmax_block(96, m, 3.0, seed=m) for m in (96, 70, 1, 96)])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = singular_values(p)
        torch.set_num_threads(3)
        several = singular_values(p)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, several)
    assert torch.equal(singular_values(p.double()), one)  # the float32 → float64 copy is exact
    wide = torch.zeros(4, 96, 192)
    wide[..., ::2] = p  # every other column: a strided view of p's values
    assert torch.equal(singular_values(wide[..., ::2]), one)
    with torch.inference_mode():
        assert torch.equal(singular_values(p.clone()), one)
    rectangular = p[:, :40, :]
    sigma = singular_values(rectangular)
    assert sigma.shape == (4, 40)
    for b in range(4):
        want = scipy.linalg.svdvals(rectangular[b].double().numpy())
        assert np.allclose(sigma[b].numpy(), want, atol=1e-12)
    assert singular_values(torch.zeros(0, 3, 8, 8)).shape == (0, 3, 8)


def test_each_matrix_visits_every_index_once_on_every_thread_and_passes_errors_on() -> None:
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def visit(i: int) -> None:
        time.sleep(0.001)  # releases the GIL, as LAPACK does: the other threads take the next indices
        with lock:
            seen.append((i, threading.get_ident()))

    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        each_matrix(visit, 50)
    finally:
        torch.set_num_threads(threads)
    assert sorted(i for i, _ in seen) == list(range(50))
    assert len({ident for _, ident in seen}) == 3

    def fail(i: int) -> None:
        if i == 7:
            raise RuntimeError("matrix 7")

    with pytest.raises(RuntimeError, match="matrix 7"):
        each_matrix(fail, 20)


def test_row_metrics_equal_the_float64_formula() -> None:
    """Entropy and sink are the float64 formulas on P's values (not float32 arithmetic): 1e-13 relative."""
    g = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(3, 4, 64, 64, generator=g) * 3, dim=-1)
    valid = torch.ones(3, 64, dtype=torch.bool)
    valid[1, 50:] = False
    p = masked(p, valid)
    got = row_metrics(p, valid, start=16)
    x = p.double()
    entropy = -(x * torch.log(x.clamp_min(torch.finfo(torch.float64).tiny))).sum((-2, -1)) / valid.sum(-1)[:, None]
    assert torch.allclose(got[..., 1], entropy, rtol=1e-13, atol=0)
    for b, m in enumerate((64, 50, 64)):
        assert torch.allclose(got[b, :, 0], x[b, :, 16:m, 0].sum(-1) / (m - 16), rtol=1e-15, atol=0)
