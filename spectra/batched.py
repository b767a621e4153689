"""The batched exact spectrum route on a CUDA GPU: σ of many P at once from the eigenvalues of their Gram matrices.

torch's `eigvalsh`/`svdvals` batch matrices only up to 32 × 32 on CUDA (`TORCH_BATCHED`) and loop one by one above;
this route forms G = P Pᵀ in float64 (symmetric, positive semidefinite, G ≥ 0 entrywise for P ≥ 0) and solves
chunks of them in one cuSOLVER call each (`spectra.cusolver`), eigenvalues only: σ_i = √max(λ_i, 0).

Why the squared condition number of G does not matter for the normalised cumulative curve c_i = S_i / S
(S_i = Σ_{j≤i} σ_j): a backward-stable eigensolver returns every λ̂_i within δ = e·u·λ₁ of λ_i (Weyl; u the
unit roundoff, e a small factor measured per precision), and |√a − √b| ≤ min(√|a − b|, |a − b|/√a), so
|σ̂_i − σ_i| ≤ e_i = min(√δ, δ/σ̂_i) — an absolute error, whatever the ratio σ₁/σ_i. Since
ĉ_i − c_i = ((1 − c_i)ΔS_i − c_i(ΔS − ΔS_i))/Ŝ, every |Δc_i| ≤ Σ_j e_j / Ŝ: the curve's error is the eigenvalue
error relative to Σσ, not to the smallest σ (`spectra.spectrum.gram_loss`, which this route evaluates per matrix,
`loss`). Where it does matter is the small-value tail: an eigenvalue below δ (≈ e·u·λ₁) is noise, so every σ_i
below √δ may come back as anything in [0, √δ] — √δ ≈ 4e-8·σ₁ in float64 but ≈ 3e-3·σ₁ in float32, where a
rank-deficient or near-uniform head's hundreds of tiny σ add up to far more than 1e-4 of Σσ. The route guards it:
negative λ̂ are clamped to 0, and a matrix whose bound exceeds half the declared tolerance is solved again in
float64 (from float32), or from its Jordan–Wielandt matrix [[0, P], [Pᵀ, 0]] (from float64), still batched: its
eigenvalues are ±σ_i themselves, each within e·u·σ₁ (not √(e·u)·σ₁; e = 2n, `jordan_error`), so the curve
moves by at most 2n²·u (6e-11 at n = 512); the float64 SVD is left only where even that bound fails. It costs
~8× a Gram solve at n, against torch's svdvals one matrix at a time (33 a second at n = 512 on an H100):
rank-collapsed heads, every deep layer of a randomly initialised encoder, made that loop the whole run's cost.
Declared tolerances on c (c@k and the whole curve): `FLOAT32_TOLERANCE` (1e-4) lets the route try float32 first;
anything tighter solves in float64 (1e-5 and the exact routes' 1e-6 alike).

Chunks: the matrices go through in chunks that fit a memory budget (`plan`), and each chunk's eigensolves in calls
of at most cuSOLVER's n·n·batch ≤ 2³¹ − 1 (`solve_in_chunks`); `plan` and `solve_in_chunks` are pure and are
tested on the CPU with a fake solver. Off a CUDA device (the CPU fallback) the exact CPU route runs instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import cusolver
from .config import Place
from .errors import SpectraError, spell
from .spectrum import GRAM_ERROR, singular_values

#: torch batches eigvalsh/svdvals on CUDA only up to this n; above it the batched route pays
TORCH_BATCHED = 32
#: declared tolerances on c of the two precisions
FLOAT32_TOLERANCE, FLOAT64_TOLERANCE = 1e-4, 1e-5
#: the exact routes' tolerance (`spectra.spectrum.EXACT_TOLERANCE` is half of it): the default
EXACT = 1e-6
#: the float32 eigenvalues of the float64 Gram matrix rounded to float32 are taken within FLOAT32_ERROR·u·λ₁ of
#: the exact ones (u = 2⁻²⁴): LAPACK's ssyevd measured at most 72·u·λ₁ on softmax matrices of every temperature
#: at n = 64…512 (the rounding to float32 adds at most u·λ₁ since G ≥ 0); cuSOLVER's is checked by the cuda tests
FLOAT32_ERROR = 128.0
#: unit roundoffs
UNIT = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
#: the share of the GPU's memory one chunk of the route may take
MEMORY_SHARE = 0.25
#: how `gram_sigma` solved each matrix: the Gram matrix in float32 or float64, the Jordan–Wielandt matrix, the SVD
FLOAT32, FLOAT64, JORDAN, SVD = 0, 1, 2, 3
LEVELS = ("float32", "float64", "Jordan–Wielandt", "SVD")

Solver = Callable[[torch.Tensor], torch.Tensor]  # symmetric (b, n, n), may be overwritten → ascending (b, n)


def precision(tolerance: float) -> torch.dtype:
    """The precision the route tries first for a declared tolerance on c."""
    return torch.float32 if tolerance >= FLOAT32_TOLERANCE else torch.float64


def plan(count: int, per_matrix: int, budget: int, cap: int | None = None) -> list[int]:
    """Chunk sizes (summing to count) of at most budget // per_matrix matrices (at least one) and at most `cap`."""
    if count < 0 or per_matrix < 1 or budget < 1 or (cap is not None and cap < 1):
        raise ValueError(f"plan needs count ≥ 0, per_matrix ≥ 1, budget ≥ 1, cap ≥ 1 (got {count}, {per_matrix}, "
                         f"{budget}, {cap})")
    size = max(1, budget // per_matrix)
    if cap is not None:
        size = min(size, cap)
    whole, rest = divmod(count, size)
    return [size] * whole + ([rest] if rest else [])


def solve_in_chunks(eigenvalues: Solver, a: torch.Tensor, limit: int = cusolver.LIMIT) -> torch.Tensor:
    """Ascending eigenvalues (b, n) of a (b, n, n) from calls of `eigenvalues` on consecutive chunks of at most
    limit // n² matrices (cuSOLVER's n·lda·batch ≤ 2³¹ − 1); one matrix per call is allowed to be the whole limit."""
    n = a.shape[-1]
    cap = limit // (n * n)
    if cap < 1:
        raise ValueError(f"one {n} × {n} matrix exceeds the solver's limit of {limit} elements per call")
    return torch.cat([eigenvalues(part) for part in a.split(plan(a.shape[0], 1, cap))]) if a.shape[0] else \
        a.new_zeros(0, n)


def cusolver_eigenvalues(a: torch.Tensor) -> torch.Tensor:
    """`Solver` on CUDA tensors: cuSOLVER's batched eigensolver in calls within its limit, info checked."""
    library = cusolver.require(a.device)
    infos: list[torch.Tensor] = []

    def call(part: torch.Tensor) -> torch.Tensor:
        w, info = library.eigenvalues(part)
        infos.append(info)
        return w

    w = solve_in_chunks(call, a)
    if infos:
        cusolver.check(torch.cat(infos))
    return w


def loss(eigenvalues: torch.Tensor, ranks: torch.Tensor, unit: float, error: float) -> torch.Tensor:
    """The bound (b,) on max_i |Δc_i| of `spectra.spectrum.gram_loss` for ascending eigenvalues (b, w) (float64)
    of which the top `ranks` (b,) are the block's (the rest are the padding's zeros, cut from the curve)."""
    tiny = torch.finfo(torch.float64).tiny
    width = eigenvalues.shape[-1]
    delta = error * unit * eigenvalues[..., -1:].clamp_min(0)
    sigma = eigenvalues.clamp_min(0).sqrt()
    kept = torch.arange(width, device=eigenvalues.device) >= width - ranks[..., None]
    moved = torch.minimum(delta.sqrt(), delta / sigma.clamp_min(tiny))
    total = torch.where(kept, sigma, 0.0).sum(-1)
    return torch.where(kept, moved, 0.0).sum(-1) / total.clamp_min(tiny)


def jordan_wielandt(p: torch.Tensor) -> torch.Tensor:
    """The symmetric matrices [[0, p], [pᵀ, 0]] (b, r + m, r + m) of p (b, r, m): eigenvalues ±σ_i and |r − m| zeros."""
    b, r, m = p.shape
    a = p.new_zeros(b, r + m, r + m)
    a[:, :r, r:] = p
    a[:, r:, :r] = p.mT
    return a


def jordan_sigma(p: torch.Tensor, ranks: torch.Tensor, solve: Solver,
                 budget: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending σ (b, min(r, m)) of float64 p (b, r, m) from the eigenvalues of its Jordan–Wielandt matrices, in
    chunks of at most `budget` bytes (the matrix and a workspace as large), and the bound (b,) on max_i |Δc_i|:
    every σ̂_i within jordan_error(r + m)·u·σ₁ (the solver's backward error on a matrix of norm σ₁), over Σσ̂."""
    r, m = p.shape[-2:]
    width = min(r, m)
    sizes = plan(len(p), 16 * (r + m) ** 2, budget) if budget is not None else [len(p)]
    eigenvalues = torch.cat([solve(jordan_wielandt(part)) for part in p.split(sizes)])
    sigma = eigenvalues[..., -width:].flip(-1).clamp_min(0)
    kept = torch.arange(width, device=p.device) < ranks[..., None]
    total = torch.where(kept, sigma, 0.0).sum(-1)
    moved = ranks * jordan_error(r + m) * UNIT[torch.float64] * sigma[..., 0]
    return sigma, moved / total.clamp_min(torch.finfo(torch.float64).tiny)


def jordan_error(size: int) -> float:
    """The factor e of the bound |σ̂_i − σ_i| ≤ e·u·σ₁ from the eigenvalues of a size × size Jordan–Wielandt
    matrix: a backward-stable symmetric eigensolver's error is at most a modest multiple of size·u·‖A‖ (‖A‖ = σ₁);
    measured ≤ 25.8 at size 1024 (LAPACK through torch, near-uniform softmax P) and checked per solver by the
    tests, so `size` itself, with room."""
    return float(size)


def gram_sigma(p: torch.Tensor, tolerance: float, solve: Solver,
               budget: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Descending σ (b, min(r, m)), float64, of matrices p (b, r, m) within `tolerance` of c by the bound, and how
    each was solved (b,) int8: `FLOAT32`, `FLOAT64` (the Gram matrix), `JORDAN` (its Jordan–Wielandt matrix, where
    the Gram bound fails in float64) or `SVD` (where even that bound fails). Zero rows and columns (padding) add
    exact zeros: σ past the matrix's min(nonzero rows, nonzero columns) are set to 0. `budget` bounds the bytes of
    the Jordan–Wielandt chunks (all at once without it)."""
    nonzero = p != 0  # one byte a entry
    ranks = torch.minimum(nonzero.any(-1).sum(-1), nonzero.any(-2).sum(-1))
    del nonzero
    p = p.to(torch.float64)
    gram = p @ p.mT if p.shape[-2] <= p.shape[-1] else p.mT @ p
    threshold = tolerance / 2
    level = torch.full((p.shape[0],), FLOAT64, dtype=torch.int8, device=p.device)
    if precision(tolerance) == torch.float32:
        eigenvalues = solve(gram.to(torch.float32)).to(torch.float64)
        again = torch.nonzero(loss(eigenvalues, ranks, UNIT[torch.float32], FLOAT32_ERROR) > threshold).flatten()
        level[:] = FLOAT32
        level[again] = FLOAT64
        if again.numel():
            eigenvalues[again] = solve(gram[again])
    else:
        eigenvalues = solve(gram)  # overwrites gram, not needed after
    del gram  # before any Jordan–Wielandt matrices (four times its size) are made
    hard = torch.nonzero((level == FLOAT64) & (loss(eigenvalues, ranks, UNIT[torch.float64], GRAM_ERROR) >
                                               threshold)).flatten()
    sigma = eigenvalues.clamp_min(0).sqrt().flip(-1)
    if hard.numel():
        sigma[hard], bound = jordan_sigma(p[hard], ranks[hard], solve, budget)
        level[hard] = JORDAN
        svd = hard[bound > threshold]
        if svd.numel():
            sigma[svd] = torch.linalg.svdvals(p[svd])
            level[svd] = SVD
    sigma = torch.where(torch.arange(sigma.shape[-1], device=p.device) < ranks[..., None], sigma, 0.0)
    return sigma.sort(dim=-1, descending=True).values, level


def batched_sigma(p: torch.Tensor, tolerance: float = EXACT, budget: int | None = None,
                  levels: torch.Tensor | None = None) -> torch.Tensor:
    """`spectra.spectrum.singular_values` by the batched route where p (..., n, n) lies on a CUDA device, within
    `tolerance` of c by the bound (float32 first where the tolerance allows); the exact CPU route elsewhere (the
    fallback path hands CPU tensors). Chunks of at most `budget` bytes (default a quarter of the GPU's memory);
    `levels` counts how each matrix was solved (`chunked_sigma`)."""
    if p.device.type != "cuda":
        return singular_values(p)
    flat = p.reshape(-1, *p.shape[-2:])
    if budget is None:
        budget = int(torch.cuda.get_device_properties(p.device).total_memory * MEMORY_SHARE)
    sigma = chunked_sigma(flat, tolerance, cusolver_eigenvalues, budget, levels)
    return sigma.reshape(*p.shape[:-2], sigma.shape[-1])


def chunked_sigma(flat: torch.Tensor, tolerance: float, solve: Solver, budget: int,
                  levels: torch.Tensor | None = None) -> torch.Tensor:
    """`gram_sigma` of flat (b, r, m) in chunks of at most `budget` bytes; `levels` (len(LEVELS),) int64, when
    given, adds how many matrices each level solved (on their device, without waiting for it)."""
    rows, cols = flat.shape[-2:]
    per_matrix = 8 * (rows * cols + 3 * min(rows, cols) ** 2)  # float64 P, G, its float32 copy and the workspace
    parts = []
    for part in flat.split(plan(len(flat), per_matrix, budget)):
        sigma, level = gram_sigma(part, tolerance, solve, budget)
        if levels is not None:
            levels += (level[:, None] == torch.arange(len(LEVELS), device=level.device)).sum(0)
        parts.append(sigma)
    return torch.cat(parts) if parts else flat.new_zeros(0, min(rows, cols), dtype=torch.float64)


_CUDA = spell("--spectrum-device cuda", 'spectrum_device="cuda"')
_CPU = spell("--spectrum-device cpu", 'spectrum_device="cpu"')


def route(place: Place, source: torch.device, width: int, missing: Callable[[], SpectraError | None]) -> str:
    """Where and how the spectra of a model on `source` with P of `width` run: "cpu" (the exact CPU route), "same"
    (torch's solvers on the model's device), "batched" (this route on the model's GPU) or "timed" (auto: time
    "same" and "cpu" on the first layer). `missing()` is why the batched route cannot run (None: it can;
    `cusolver.available`), asked only where the answer matters. --spectrum-device cuda without what it needs is
    one SpectraError line."""
    place = Place(place)
    if place == Place.CUDA:
        if source.type != "cuda":
            raise SpectraError(f"{_CUDA} runs the spectra on the model's CUDA device, and the model is on {source}; "
                               f"use {_CPU}, or {spell('--device cuda')} on a machine with a GPU")
        reason = missing()
        if reason is not None:
            raise reason
        return "batched"
    if source.type in ("cpu", "mps") or place == Place.CPU:
        return "cpu"  # MPS has no float64 and no batched LAPACK
    if place == Place.SAME:
        return "same"
    return "batched" if width > TORCH_BATCHED and missing() is None else "timed"
