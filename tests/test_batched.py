"""The batched Gram route: its chunking (a fake solver that records the chunks), its per-matrix bound, its accuracy
against scipy's float64 SVD (emulated on the CPU with torch's eigvalsh as the solver), the choice of route, and on
a GPU the route itself against the exact CPU route."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from spectra import batched
from spectra.batched import (
    EXACT,
    FLOAT32,
    FLOAT32_TOLERANCE,
    FLOAT64,
    FLOAT64_TOLERANCE,
    JORDAN,
    LEVELS,
    SVD,
    batched_sigma,
    chunked_sigma,
    gram_sigma,
    jordan_error,
    jordan_sigma,
    jordan_wielandt,
    loss,
    plan,
    precision,
    route,
    solve_in_chunks,
)
from spectra.config import Place
from spectra.errors import SpectraError
from spectra.spectrum import cumulative, gram_loss, singular_values


def softmax(batch: int, n: int, seed: int, scales=(0.0, 0.05, 0.5, 2.0, 6.0, 20.0)) -> torch.Tensor:
    """Softmax matrices (batch, n, n), float64, at temperatures from exactly uniform (rank 1) to near one-hot."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.tensor(scales, dtype=torch.float64).repeat(batch // len(scales) + 1)[:batch, None, None]
    return torch.softmax(scale * torch.randn(batch, n, n, generator=generator, dtype=torch.float64), -1)


def curve_error(sigma: torch.Tensor, p: torch.Tensor) -> np.ndarray:
    """max_i |Δc_i| of each matrix (b,) against scipy's float64 SVD."""
    reference = np.stack([scipy.linalg.svdvals(m) for m in p.double().numpy()])
    return np.abs(cumulative(sigma.double()).numpy() - cumulative(torch.from_numpy(reference)).numpy()).max(-1)


def test_plan_covers_the_count_within_budget_and_cap() -> None:
    assert plan(10, per_matrix=3, budget=10) == [3, 3, 3, 1]
    assert plan(10, per_matrix=3, budget=100, cap=4) == [4, 4, 2]
    assert plan(5, per_matrix=100, budget=10) == [1] * 5  # a matrix over the budget still goes, alone
    assert plan(0, 1, 1) == [] and plan(6, 1, 6) == [6]
    with pytest.raises(ValueError, match="plan needs"):
        plan(3, 0, 10)


def test_chunks_stay_within_the_limit_and_give_the_unchunked_values_bitwise() -> None:
    a = softmax(23, 12, seed=1)
    a = a @ a.mT
    calls: list[int] = []

    def fake(part: torch.Tensor) -> torch.Tensor:
        calls.append(part.shape[0])
        return torch.linalg.eigvalsh(part)

    limit = 5 * 12 * 12 + 7  # five 12 × 12 matrices per call
    got = solve_in_chunks(fake, a.clone(), limit=limit)
    assert calls == [5, 5, 5, 5, 3] and all(size * 12 * 12 <= limit for size in calls)
    assert torch.equal(got, torch.linalg.eigvalsh(a))
    assert solve_in_chunks(fake, a[:0]).shape == (0, 12)
    with pytest.raises(ValueError, match="exceeds the solver's limit"):
        solve_in_chunks(fake, a, limit=100)


def test_cusolvers_limit_takes_8191_matrices_of_512_per_call() -> None:
    calls: list[int] = []
    # one zero matrix seen 16,383 times (a stride-0 view): the chunking reads shapes only, and a real 16,383 × 512 × 512
    # tensor would take 17 GB
    many = torch.zeros(1, 512, 512, dtype=torch.float32).expand(8191 * 2 + 1, -1, -1)
    solve_in_chunks(lambda part: calls.append(part.shape[0]) or part[..., 0], many)
    assert calls == [8191, 8191, 1]


def test_the_loss_is_gram_loss_and_leaves_the_padding_out() -> None:
    eigenvalues = torch.linalg.eigvalsh((lambda p: p @ p.mT)(softmax(6, 20, seed=2)))
    full = torch.full((6,), 20)
    for dtype, error in ((torch.float64, 16.0), (torch.float32, 128.0)):
        ours = loss(eigenvalues.to(dtype).double(), full, batched.UNIT[dtype], error)
        assert np.allclose(ours.numpy(), gram_loss(eigenvalues.to(dtype).numpy(), error), rtol=1e-5, atol=0)
    padded = torch.cat([torch.zeros(6, 5, dtype=torch.float64), eigenvalues], -1)  # five more exact zeros
    assert torch.allclose(loss(padded, full, 2.0**-53, 16.0), loss(eigenvalues, full, 2.0**-53, 16.0))


@pytest.mark.parametrize("tolerance", [EXACT, FLOAT64_TOLERANCE, FLOAT32_TOLERANCE, 1e-3])
@pytest.mark.parametrize("n", [48, 200])
def test_the_gram_route_keeps_c_within_its_tolerance(n: int, tolerance: float) -> None:
    """Softmax P of every temperature, uniform random P, and padded ones, against scipy's float64 SVD: every
    curve within the declared tolerance; σ past the block exact zeros."""
    p = torch.cat([softmax(12, n, seed=n), torch.rand(4, n, n, generator=torch.Generator().manual_seed(3),
                                                       dtype=torch.float64)])
    p[-3:, n - 9:, :] = 0  # padded queries and keys
    p[-3:, :, n - 9:] = 0
    sigma, level = gram_sigma(p.to(torch.float32), tolerance, torch.linalg.eigvalsh)
    assert (curve_error(sigma, p.to(torch.float32)) <= tolerance).all()
    assert (sigma[-3:, n - 9:] == 0).all()
    assert set(level.tolist()) <= ({FLOAT32, FLOAT64, JORDAN} if precision(tolerance) == torch.float32 else
                                   {FLOAT64, JORDAN})
    if tolerance == EXACT:  # exactly uniform P (rank 1, n − 1 zeros): the Gram bound sends it to Jordan–Wielandt
        assert level[0] == JORDAN


def test_the_jordan_wielandt_matrix_holds_plus_and_minus_sigma() -> None:
    """[[0, P], [Pᵀ, 0]] of a rectangular P: its eigenvalues are ±σ_i and |r − m| zeros (scipy's SVD)."""
    p = torch.rand(3, 7, 11, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    sigma = np.stack([scipy.linalg.svdvals(m) for m in p.numpy()])
    expected = np.sort(np.concatenate([sigma, -sigma, np.zeros((3, 4))], -1), -1)
    assert np.allclose(torch.linalg.eigvalsh(jordan_wielandt(p)).numpy(), expected, rtol=0, atol=1e-13)
    got, bound = jordan_sigma(p, torch.full((3,), 7), torch.linalg.eigvalsh)
    assert np.allclose(got.numpy(), sigma, rtol=0, atol=1e-13) and (bound < 1e-12).all()


def collapsed(batch: int, n: int, seed: int, noise=(0.0, 1e-6, 1e-5, 1e-4)) -> torch.Tensor:
    """Rank-collapsed softmax P (batch, n, n), float64: every query's logits one key vector plus a little noise, the
    attention of a randomly initialised encoder's deep layers (their tokens' states converge)."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.tensor(noise, dtype=torch.float64).repeat(batch // len(noise) + 1)[:batch, None, None]
    shared = torch.randn(batch, 1, n, generator=generator, dtype=torch.float64)
    return torch.softmax(shared + scale * torch.randn(batch, n, n, generator=generator, dtype=torch.float64), -1)


@pytest.mark.parametrize(("n", "tolerance"), [(64, EXACT), (256, FLOAT64_TOLERANCE)])
def test_collapsed_heads_are_solved_batched_not_one_by_one(n: int, tolerance: float) -> None:
    """Rank-collapsed P fail the Gram bound (hundreds of σ near √(u·λ₁) against Σσ ≈ σ₁); they go to their
    Jordan–Wielandt matrices in one batched call of size 2n, each σ within jordan_error(2n)·u·σ₁ of scipy's, the
    curve within the tolerance, and none to the SVD."""
    p = collapsed(8, n, seed=n)
    shapes: list[tuple[int, ...]] = []

    def solver(a: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(a.shape))
        return torch.linalg.eigvalsh(a)

    sigma, level = gram_sigma(p, tolerance, solver)
    hard = (level == JORDAN).nonzero().flatten().tolist()
    assert len(hard) >= 4 and SVD not in level.tolist()
    assert shapes == [(8, n, n), (len(hard), 2 * n, 2 * n)]  # one call for the Gram matrices, one for the hard ones
    reference = np.stack([scipy.linalg.svdvals(m) for m in p.numpy()])
    moved = np.abs(sigma.numpy() - reference) / (2.0**-53 * reference[:, :1])
    print(f"n = {n}: Jordan–Wielandt max |Δσ| = {moved[hard].max():.1f}·u·σ₁ (bound {jordan_error(2 * n):.0f})")
    assert moved[hard].max() <= jordan_error(2 * n)
    assert (curve_error(sigma, p) <= tolerance).all()


def test_the_svd_is_left_only_where_even_the_jordan_bound_fails() -> None:
    """A tolerance under the Jordan–Wielandt bound (n·jordan_error(2n)·u, ~1e-13 here; the command line refuses
    anything under 1e-6) sends every matrix on to the float64 SVD: the guard is there, and reached."""
    p = collapsed(4, 32, seed=8)
    sigma, level = gram_sigma(p, 1e-14, torch.linalg.eigvalsh)
    assert (level == SVD).all()
    reference = np.stack([scipy.linalg.svdvals(m) for m in p.numpy()])
    # two backward-stable SVDs (torch's LAPACK, scipy's) agree within 2n·u·σ₁ on any machine, not bitwise
    bound = 2 * p.shape[-1] * np.finfo(np.float64).eps * reference.max()
    assert np.abs(sigma.numpy() - reference).max() <= bound


def test_the_jordan_wielandt_calls_keep_within_the_budget_and_give_the_same_values_bitwise() -> None:
    p = collapsed(6, 40, seed=9)
    shapes: list[int] = []

    def solver(a: torch.Tensor) -> torch.Tensor:
        shapes.append(a.shape[0])
        return torch.linalg.eigvalsh(a)

    whole = gram_sigma(p, EXACT, torch.linalg.eigvalsh)
    parts = gram_sigma(p, EXACT, solver, budget=2 * 16 * 80 * 80)  # two Jordan–Wielandt matrices a call
    hard = int((whole[1] == JORDAN).sum())
    assert hard >= 3 and shapes[0] == 6 and shapes[1:] == plan(hard, 1, 2)
    assert torch.equal(whole[0], parts[0]) and torch.equal(whole[1], parts[1])


def test_chunks_count_how_each_matrix_was_solved() -> None:
    noise = torch.randn(5, 48, 48, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    diagonal = torch.softmax(10 * torch.eye(48, dtype=torch.float64) + 0.1 * noise, -1)  # every σ near 1: float32
    p = torch.cat([collapsed(6, 48, seed=10), diagonal])
    levels = torch.zeros(len(LEVELS), dtype=torch.int64)
    sigma = chunked_sigma(p, FLOAT32_TOLERANCE, torch.linalg.eigvalsh, budget=3 * 8 * 4 * 48 * 48, levels=levels)
    expected = torch.bincount(gram_sigma(p, FLOAT32_TOLERANCE, torch.linalg.eigvalsh)[1].long(),
                              minlength=len(LEVELS))
    assert torch.equal(levels, expected) and levels.sum() == len(p) and levels[FLOAT32] >= 5
    assert torch.equal(sigma, gram_sigma(p, FLOAT32_TOLERANCE, torch.linalg.eigvalsh)[0])


def test_float32_alone_would_break_the_tolerance_in_the_tail() -> None:
    """Near-uniform P (hundreds of σ below √(u·λ₁)): float32 eigenvalues alone move c by more than 1e-4, so the
    route solves them again in float64 — the guard is what keeps the tolerance."""
    p = softmax(6, 200, seed=4, scales=(0.0, 0.02, 0.05))
    gram = p @ p.mT
    raw = torch.linalg.eigvalsh(gram.float()).double().clamp_min(0).sqrt().flip(-1)
    assert curve_error(raw, p).max() > FLOAT32_TOLERANCE
    sigma, level = gram_sigma(p, FLOAT32_TOLERANCE, torch.linalg.eigvalsh)
    assert (level >= 1).all() and (curve_error(sigma, p) <= FLOAT32_TOLERANCE).all()


def test_the_solver_sees_float32_only_where_the_tolerance_allows() -> None:
    p = softmax(6, 32, seed=5, scales=(3.0,))
    seen: list[torch.dtype] = []

    def solver(a: torch.Tensor) -> torch.Tensor:
        seen.append(a.dtype)
        return torch.linalg.eigvalsh(a)

    gram_sigma(p, FLOAT64_TOLERANCE, solver)
    assert seen == [torch.float64]
    seen.clear()
    gram_sigma(p, 1e-2, solver)
    assert seen[0] == torch.float32


def test_off_the_gpu_the_route_is_the_exact_cpu_one() -> None:
    p = softmax(6, 24, seed=6).float()
    assert torch.equal(batched_sigma(p, tolerance=FLOAT32_TOLERANCE), singular_values(p))


CUDA, CPU, MPS = torch.device("cuda", 0), torch.device("cpu"), torch.device("mps")


def test_the_route_choice() -> None:
    def never() -> SpectraError:
        raise AssertionError("asked about the library where it does not matter")

    def absent() -> SpectraError:
        return SpectraError("no libcusolver")

    for place in Place:
        if place != Place.CUDA:
            assert route(place, CPU, 512, never) == "cpu" and route(place, MPS, 512, never) == "cpu"
    assert route(Place.CPU, CUDA, 512, never) == "cpu"
    assert route(Place.SAME, CUDA, 512, never) == "same"
    assert route(Place.CUDA, CUDA, 512, lambda: None) == "batched"
    assert route(Place.CUDA, CUDA, 16, lambda: None) == "batched"  # asked for: taken at any n
    assert route(Place.AUTO, CUDA, 512, lambda: None) == "batched"
    assert route(Place.AUTO, CUDA, batched.TORCH_BATCHED, never) == "timed"  # torch batches these itself
    assert route(Place.AUTO, CUDA, 512, absent) == "timed"
    assert route("auto", CUDA, 33, lambda: None) == "batched"


def test_asking_for_cuda_where_it_cannot_run_is_one_line() -> None:
    with pytest.raises(SpectraError, match="no libcusolver"):
        route(Place.CUDA, CUDA, 512, lambda: SpectraError("no libcusolver"))
    with pytest.raises(SpectraError, match="runs the spectra on the model's CUDA device, and the model is on cpu"):
        route(Place.CUDA, CPU, 512, lambda: None)


@pytest.mark.cuda
@pytest.mark.parametrize("tolerance", [EXACT, FLOAT64_TOLERANCE, FLOAT32_TOLERANCE])
@pytest.mark.parametrize("n", [128, 512])
def test_on_cuda_the_batched_route_keeps_c_within_its_tolerance(n: int, tolerance: float) -> None:
    """The route on the GPU (cuSOLVER, in chunks: a budget of three matrices) against scipy's float64 SVD."""
    p = softmax(12, n, seed=n).float()
    p[-2:, n - 20:, :] = 0
    p[-2:, :, n - 20:] = 0
    budget = 3 * 8 * 4 * n * n
    sigma = batched_sigma(p.cuda(), tolerance, budget=budget).cpu()
    assert (curve_error(sigma, p) <= tolerance).all()
    assert torch.equal(sigma, batched_sigma(p.cuda(), tolerance, budget=budget).cpu())  # deterministic


@pytest.mark.cuda
@pytest.mark.parametrize(("n", "tolerance"), [(128, EXACT), (512, FLOAT64_TOLERANCE)])
def test_on_cuda_collapsed_heads_take_the_jordan_wielandt_route(n: int, tolerance: float) -> None:
    """Rank-collapsed P on the GPU: cuSOLVER's eigenvalues of their Jordan–Wielandt matrices put each σ within
    jordan_error(2n)·u·σ₁ of scipy's, the curves within the tolerance, none to the SVD; run.json's counts agree."""
    p = collapsed(8, n, seed=n).float()
    sigma, level = gram_sigma(p.cuda(), tolerance, batched.cusolver_eigenvalues)
    sigma, level = sigma.cpu(), level.cpu()
    hard = (level == JORDAN).nonzero().flatten()
    reference = np.stack([scipy.linalg.svdvals(m) for m in p.double().numpy()])
    moved = np.abs(sigma.numpy() - reference) / (2.0**-53 * reference[:, :1])
    print(f"n = {n}: cuSOLVER Jordan–Wielandt max |Δσ| = {moved[hard].max():.1f}·u·σ₁ (bound {jordan_error(2 * n):.0f})")
    assert len(hard) >= 4 and SVD not in level.tolist()
    assert moved[hard].max() <= jordan_error(2 * n)
    assert (curve_error(sigma, p) <= tolerance).all()
    levels = torch.zeros(len(LEVELS), dtype=torch.int64, device="cuda")
    assert torch.equal(batched_sigma(p.cuda(), tolerance, levels=levels).cpu(), sigma)
    assert torch.equal(levels.cpu(), torch.bincount(level.long(), minlength=len(LEVELS)))
