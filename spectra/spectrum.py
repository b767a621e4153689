"""Singular spectra of the context mapping matrix P, and the curves and metrics that summarise them.

For a sequence of m valid tokens, P's valid block is m×m. Padded rows and columns are zeroed, so the
n×n matrix's singular values are the block's m values followed by zeros (the routes cut the zero rows and
columns away before any arithmetic). The normalized cumulative
curve c_i = Σ_{j≤i} σ_j / Σ_j σ_j is then resampled onto the relative grid t = j/n (j = 1…n) by linear
interpolation through (i/m, c_i) with c_0 = 0, so curves of different lengths average index by index;
for m = n the grid is the absolute index and nothing is interpolated. `probes.spectrum` streams these
over a run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch

from . import lapack

T = TypeVar("T")

#: per-matrix summaries, in table order: those of the spectrum (`summarize`), then of the rows (`row_metrics`)
SPECTRUM_METRICS = ("sigma1", "nuclear", "stable_rank", "erank", "rank90", "rank99", "c_at", "length")
ROW_METRICS = ("sink", "entropy")
METRICS = SPECTRUM_METRICS + ROW_METRICS
#: queries before this rank are left out of the sink mass (their rows are short: any key is a large share)
SINK_FROM = 16


def split_threads(fn: Callable[[torch.Tensor], T], x: torch.Tensor) -> list[T]:
    """fn over chunks of the batch x (flattened leading axes): on CPU one chunk per core, each in its own
    thread with one intra-op thread.

    Batched LAPACK calls (svdvals, svd) nest torch's batch parallelism with the library's own threads
    and, on a few cores, run many times slower than this split (measured 0.83 s vs 0.03 s per 512×512
    svdvals on 2 busy cores); on GPU fn runs on the whole batch.
    """
    flat = x.reshape(-1, *x.shape[-2:])
    workers = torch.get_num_threads()
    if x.device.type != "cpu" or workers == 1 or flat.shape[0] < 2:
        return [fn(flat)]
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(fn, flat.chunk(workers)))
    finally:
        torch.set_num_threads(workers)


#: exact mode: the eigenvalues of the float64 Gram matrix are taken to be within δ = GRAM_ERROR·u·λ₁ of the
#: exact ones (u = 2⁻⁵³). Measured for the CPU route (dsyrk + dsyevd, scipy's OpenBLAS) on softmax matrices of
#: every temperature at n = 16…1024 and on the real attention of all-MiniLM-L6-v2 at n = 512 (full and a
#: padded block), against float64 SVDs: at most 9.3·u·λ₁ for the values below σ₁/10, except exactly uniform P
#: (11–90·u·λ₁ at n = 128…1024), which falls back whatever the factor; the torch route (float64 product,
#: eigvalsh) measured at most 10.8·u·λ₁ the same way. Both routes' bound is checked in tests/test_spectrum.py.
GRAM_ERROR = 16.0
#: exact mode: a matrix whose bound on max_i |Δc_i| (see `gram_loss`) exceeds this is recomputed with the
#: float64 SVD: half of the 1e-6 the mode promises, as a safety margin.
EXACT_TOLERANCE = 5e-7


def gram_loss(eigenvalues: np.ndarray, error: float = GRAM_ERROR) -> np.ndarray:
    """A bound on max_i |Δc_i| when σ_i = √λ̂_i is taken from the eigenvalues λ̂ (..., m) of a float64 Gram matrix.

    If every λ̂_i is within δ = error·u·λ₁ of the exact λ_i (Weyl: the Gram matrix's rounding, ≤ γ_n·λ₁ for
    P ≥ 0, plus the eigensolver's backward error, both normwise), then σ̂_i = √max(λ̂_i, 0) is within
    e_i = min(√δ, δ/σ̂_i) of σ_i, since |√a − √b| = |a − b|/(√a + √b) ≤ min(√|a − b|, |a − b|/√a). With
    S_i = Σ_{j≤i}σ_j, S = S_m and E = Σ_j e_j, ĉ_i − c_i = ((1 − c_i)ΔS_i − c_i(ΔS − ΔS_i))/Ŝ, so
    |Δc_i| ≤ E/Ŝ for every i. The many tiny singular values of near-uniform or rank-deficient P each add
    up to √δ ≈ 4e-8·σ₁ and push the bound up; well-spread spectra stay many orders below it.
    """
    eigenvalues = np.asarray(eigenvalues)
    tiny, u = np.finfo(eigenvalues.dtype).tiny, np.finfo(eigenvalues.dtype).eps / 2
    delta = error * u * np.maximum(eigenvalues.max(-1, keepdims=True), 0)
    sigma = np.sqrt(np.maximum(eigenvalues, 0))
    moved = np.minimum(np.sqrt(delta), delta / np.maximum(sigma, tiny)).sum(-1)
    return moved / np.maximum(sigma.sum(-1), tiny)


def each_matrix(fn: Callable[[int], None], count: int) -> None:
    """fn(i) for i in 0…count−1, one matrix at a time on each of torch.get_num_threads() threads (the caller's
    among them), taking the next index as they finish (the SVD fallback makes some matrices slower), with the
    BLAS libraries at one thread each. fn must release the GIL for its heavy work (LAPACK through
    `spectra.lapack`, numpy's loops)."""
    workers = max(1, min(torch.get_num_threads(), count))
    indices, lock = iter(range(count)), threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(indices, None)
            if i is None:
                return
            fn(i)

    with lapack.one_blas_thread():
        if workers == 1:
            work()
            return
        with ThreadPoolExecutor(workers - 1) as pool:
            helpers = [pool.submit(work) for _ in range(workers - 1)]
            work()
            for helper in helpers:
                helper.result()


def _nonzero_block(a: np.ndarray) -> np.ndarray:
    """The block of a (r, m) left by cutting its all-zero rows and columns (a itself when there are none)."""
    rows, cols = a.any(1), a.any(0)
    if rows.all() and cols.all():
        return a
    return a[np.ix_(rows, cols)]


def _lapack_sigma(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact route on the CPU: per matrix, σ (min(r, m), then zeros) of its nonzero block, as √eig of the
    smaller float64 Gram matrix (dsyrk, dsyevd), or the float64 SVD (dgesdd) where `gram_loss` exceeds
    EXACT_TOLERANCE; and which matrices took the SVD. p (b, r, m), float32 or float64, read without a copy."""
    arrays = p.detach().contiguous().numpy()
    count, rows, cols = arrays.shape
    sigma = np.zeros((count, min(rows, cols)))
    fell_back = np.zeros(count, dtype=bool)
    local = threading.local()

    def one(i: int) -> None:
        block = _nonzero_block(arrays[i])
        if block.size == 0:
            return  # an all-zero matrix: σ = 0
        space = getattr(local, "space", None)
        if space is None:
            space = local.space = lapack.Workspace(max(rows, cols))
        eigenvalues = space.gram_eigenvalues(block)
        if gram_loss(eigenvalues) > EXACT_TOLERANCE:
            fell_back[i] = True
            values = space.singular_values(block)
        else:
            values = np.sqrt(np.maximum(eigenvalues[::-1], 0))
        sigma[i, : values.size] = values

    each_matrix(one, count)
    return torch.from_numpy(sigma), torch.from_numpy(fell_back)


def _first(keep: torch.Tensor, count: int) -> torch.Tensor:
    """Indices (..., count) of the True entries of keep (..., n), in order (each row has `count` of them)."""
    return torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :count]


def _gram_or_svd(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """σ (b, min(r, m)) of float64 matrices (b, r, m) from the smaller Gram matrix (PᵀP or PPᵀ: the same
    nonzero eigenvalues), and which of them `gram_loss` sent to the SVD."""
    gram = p.mT @ p if p.shape[-2] >= p.shape[-1] else p @ p.mT
    eigenvalues = torch.linalg.eigvalsh(gram)
    sigma = eigenvalues.clamp_min(0).sqrt().flip(-1)
    redo = torch.from_numpy(gram_loss(eigenvalues.cpu().numpy()) > EXACT_TOLERANCE).to(p.device)
    if redo.any():
        sigma[redo] = torch.linalg.svdvals(p[redo])
    # descending, whatever the solver returned (on an H100, σ of a near one-hot 512×512 P came back out of order by
    # rounding); a no-op on sorted values
    return sigma.sort(dim=-1, descending=True).values, redo


def torch_sigma(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact route in batched torch calls, for GPUs (on the CPU `spectra.lapack` is faster): σ (b, n) in
    float64 to within EXACT_TOLERANCE of c, and which matrices fell back to the SVD: √eig of the float64 Gram
    matrix, the float64 SVD where `gram_loss` says the Gram route could lose more.

    Zero rows and columns (padding) are cut away first, so they give exact zeros, cost nothing and do not
    count in the bound; matrices with the same numbers of nonzero rows and columns are done together.
    """
    size = p.abs()
    rows, cols = size.sum(-1) > 0, size.sum(-2) > 0  # sums of |p|: zero only for all-zero rows/columns
    p = p.to(torch.float64)
    if bool((rows.all(-1) & cols.all(-1)).all()):  # nothing padded: one batch
        return _gram_or_svd(p)
    b, rows_n, cols_n = p.shape
    out = p.new_zeros(b, min(rows_n, cols_n))
    fell_back = torch.zeros(b, dtype=torch.bool, device=p.device)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, shape in enumerate(zip(rows.sum(-1).tolist(), cols.sum(-1).tolist())):
        groups.setdefault(shape, []).append(i)
    for (size_r, size_m), members in groups.items():
        if size_r == 0 or size_m == 0:
            continue  # all-zero matrices: σ = 0
        index = torch.tensor(members, device=p.device)
        block = p[index]
        if size_r < rows_n:
            block = block.gather(-2, _first(rows[index], size_r)[..., None].expand(-1, -1, cols_n))
        if size_m < cols_n:
            block = block.gather(-1, _first(cols[index], size_m)[:, None, :].expand(-1, size_r, -1))
        sigma, redo = _gram_or_svd(block)
        out[index, : sigma.shape[-1]] = sigma
        fell_back[index] = redo
    return out, fell_back


def singular_values_routed(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`singular_values` (..., n) and which matrices (...) the route sent to the float64 SVD."""
    if p.device.type == "mps":  # no float64 and no batched LAPACK on Apple GPUs: the CPU does the spectra
        p = p.cpu()
    p = p.to(torch.promote_types(p.dtype, torch.float32))
    flat = p.reshape(-1, *p.shape[-2:])
    if flat.shape[0] == 0:
        sigma, fell_back = flat.new_zeros(0, min(p.shape[-2:]), dtype=torch.float64), flat.new_zeros(0, dtype=torch.bool)
    else:
        sigma, fell_back = _lapack_sigma(flat) if p.device.type == "cpu" else torch_sigma(flat)
    return sigma.reshape(*p.shape[:-2], sigma.shape[-1]), fell_back.reshape(p.shape[:-2])


def singular_values(p: torch.Tensor) -> torch.Tensor:
    """Descending singular values (float64) of a batch of square matrices (..., n, n), within 1e-6 of a float64
    SVD in c (by the bound; ~1e-9 measured on real attention): √eig of the float64 Gram matrix, with the matrices
    whose error bound exceeds EXACT_TOLERANCE (near-uniform or rank-deficient P) recomputed with the float64
    SVD (see `gram_loss`). On the CPU one matrix per core through scipy's LAPACK (`spectra.lapack`); on a GPU
    batched torch calls (`torch_sigma`). Zero rows and columns (padding) are cut away first."""
    return singular_values_routed(p)[0]


def masked(p: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Zero the rows and columns of padded positions: P (B, H, n, n), valid (B, n)."""
    keep = valid[:, None, :].to(p.dtype)
    return p * keep[..., :, None] * keep[..., None, :]


def cumulative(sigma: torch.Tensor) -> torch.Tensor:
    """c_i = Σ_{j≤i} σ_j / Σ_j σ_j along the last axis."""
    total = sigma.cumsum(-1)
    return total / total[..., -1:].clamp_min(torch.finfo(sigma.dtype).tiny)


def resample(cum: torch.Tensor, lengths: torch.Tensor, size: int) -> torch.Tensor:
    """Curve values at the relative grid j/size (j = 1…size) of curves whose first `lengths` values are valid.

    cum (..., w) holds c_1…c_w (c_i = 1 for i ≥ m); lengths (...) holds m ≤ w. Exact integer
    arithmetic places grid points, so m = size reproduces cum without interpolation.
    """
    width = cum.shape[-1]
    padded = torch.cat([torch.zeros_like(cum[..., :1]), cum], dim=-1)  # c_0 … c_w
    j = torch.arange(1, size + 1, device=cum.device)
    scaled = j * lengths.to(torch.long)[..., None]  # grid point j/size sits at index scaled/size
    lo = torch.div(scaled, size, rounding_mode="floor")
    frac = (scaled - lo * size).to(cum.dtype) / size
    hi = (lo + 1).clamp_max(width)
    return padded.gather(-1, lo) * (1 - frac) + padded.gather(-1, hi) * frac


def summarize(
    sigma: torch.Tensor, lengths: torch.Tensor, at: int, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative-grid curve (..., size) and per-matrix SPECTRUM_METRICS (..., 8) from singular values.

    sigma (..., w) descending, of matrices whose valid blocks are lengths (...) ≤ w; values past a
    block's length are treated as zero. `at` is a 1-based index of the grid.
    """
    index = torch.arange(sigma.shape[-1], device=sigma.device)
    sigma = torch.where(index < lengths[..., None], sigma, torch.zeros_like(sigma))
    cum = cumulative(sigma)
    grid = resample(cum, lengths, size)
    nuclear = sigma.sum(-1)
    sigma1 = sigma[..., 0]
    share = sigma / nuclear[..., None]
    entropy = -(share * torch.log(share.clamp_min(torch.finfo(share.dtype).tiny))).sum(-1)
    within = index < lengths[..., None]
    rank = [((cum < energy) & within).sum(-1) + 1 for energy in (0.9, 0.99)]
    metrics = torch.stack(
        [
            sigma1,
            nuclear,
            (sigma**2).sum(-1) / sigma1**2,
            torch.exp(entropy),
            rank[0].to(sigma.dtype),
            rank[1].to(sigma.dtype),
            grid[..., at - 1],
            lengths.to(sigma.dtype),
        ],
        dim=-1,
    )
    return grid, metrics


def sink_start(n: int) -> int:
    """The first query (0-based, counted from the first valid token) whose row enters the sink mass: 16, or
    n/8 for short sequences."""
    return max(1, min(SINK_FROM, n // 8))


def _entropy_totals(p: torch.Tensor) -> torch.Tensor:
    """Σ_ij −p_ij ln p_ij (float64) of each matrix of p (b, r, m); zero entries add nothing. On the CPU one
    matrix per thread in numpy (its loops release the GIL) with reused float64 buffers, instead of float64
    copies of the whole batch."""
    tiny = np.finfo(np.float64).tiny
    if p.device.type != "cpu":
        p = p.to(torch.float64)
        return -(p * torch.log(p.clamp_min(tiny))).sum((-2, -1))
    arrays = p.detach().to(torch.promote_types(p.dtype, torch.float32)).contiguous().numpy()  # bfloat16: no numpy
    totals = np.zeros(arrays.shape[0])
    local = threading.local()

    def one(i: int) -> None:
        if getattr(local, "buffers", None) is None:
            local.buffers = np.empty(arrays.shape[1:]), np.empty(arrays.shape[1:])
        x, logs = local.buffers
        np.copyto(x, arrays[i])
        np.log(np.maximum(x, tiny, out=logs), out=logs)
        totals[i] = -np.vdot(x, logs)  # one pass, no product array

    each_matrix(one, arrays.shape[0])
    return torch.from_numpy(totals)


def query_rows(valid: torch.Tensor, start: int) -> torch.Tensor:
    """The queries a per-query mean takes (B, n): valid, from position `start` among the valid tokens on (all but
    the first valid token when the sequence is shorter). The sink mass averages over them, and so do the head
    diagnosis's per-query scores."""
    rank = valid.long().cumsum(-1) - 1  # (B, n): position among the valid tokens
    lengths = valid.sum(-1, keepdim=True)
    begin = torch.minimum(torch.full_like(lengths, start), (lengths - 1).clamp_min(0))
    return valid & (rank >= begin)


def row_metrics(p: torch.Tensor, valid: torch.Tensor, start: int) -> torch.Tensor:
    """Sink mass and entropy (..., 2), float64, of each P (B, H, n, n) whose padded rows and columns are zero.

    sink = the mean over queries from `start` on (counted from the first valid token; all but the first when
    the sequence is shorter) of P[i, first valid key]: the attention-sink share (Xiao et al. 2023);
    entropy = the mean over valid queries of −Σ_j p_ij ln p_ij, in nats (padded rows are zero: they add nothing).
    """
    lengths = valid.sum(-1, keepdim=True)
    first = valid.long().argmax(-1)  # (B,)
    rows = query_rows(valid, start).to(torch.float64)  # (B, n)
    to_sink = torch.gather(p, -1, first[:, None, None, None].expand(*p.shape[:-1], 1))[..., 0].to(torch.float64)
    sink = (to_sink * rows[:, None]).sum(-1) / rows.sum(-1, keepdim=True).clamp_min(1)
    totals = _entropy_totals(p.reshape(-1, *p.shape[-2:])).reshape(p.shape[:-2]).to(sink.device)
    entropy = totals / lengths.to(torch.float64).clamp_min(1)
    return torch.stack([sink, entropy], dim=-1)
