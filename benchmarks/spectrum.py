"""Spectrum stage: the project's routine against the naive loop and the bare batched library call.

    python benchmarks/spectrum.py [--repeats 3] [--sizes 128,256,512]

For each n, 144 row-stochastic matrices (softmax of Gaussian logits: the 12×12 heads of one
RoBERTa-base sequence), without and with padding (every other sequence of length 0.7·n), timed as
- naive:   a Python loop of numpy.linalg.svd(compute_uv=False) per matrix (after output_attentions=True
           a researcher holds float32 numpy arrays);
- bare:    torch.linalg.svdvals on the whole batch, with torch's default threads and with one thread;
- project: spectra.probes.spectrum.SpectrumProbe.add (masking, singular values, curves and metrics),
           exact and fast (--spectrum fast) modes.
Every time is the best of --repeats; ratios come from the same run. Also reports the largest |Δc|
of each mode against a float64 scipy reference on 8 of the matrices.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import scipy.linalg
import torch

from spectra.capture import key_valid
from spectra.probes.spectrum import SpectrumProbe
from spectra.spectrum import cumulative, singular_values


def matrices(n: int, padded: bool, heads: int = 12, batch: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """P (batch, heads, n, n) and its additive mask (batch, 1, n, n)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.5, 6.0, heads)[None, :, None, None]
    logits = torch.randn(batch, heads, n, n, generator=g) * scale
    mask = torch.zeros(batch, 1, n, n)
    if padded:
        mask[1::2, ..., int(0.7 * n):] = torch.finfo(torch.float32).min
    return torch.softmax(logits + mask, dim=-1), mask


def best(fn, repeats: int) -> float:
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


def with_threads(threads: int, fn):
    def run():
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            fn()
        finally:
            torch.set_num_threads(old)
    return run


def accuracy(p: torch.Tensor, route) -> float:
    """Largest |Δc| on 8 of the matrices p (..., n, n) between route(matrices) → σ and float64 scipy."""
    flat = p.reshape(-1, *p.shape[-2:])
    flat = flat[:: max(1, flat.shape[0] // 8)][:8]
    reference = np.stack([scipy.linalg.svdvals(m) for m in flat.double().cpu().numpy()])
    c_ref = np.cumsum(reference, -1) / reference.sum(-1, keepdims=True)
    sigma = route(flat).double().cpu().clamp_min(0).sort(-1, descending=True).values
    return float(np.abs(cumulative(sigma).numpy() - c_ref).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="128,256,512")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}")
    print("| n | padding | naive loop (s) | bare svdvals, default threads (s) | bare svdvals, 1 thread (s) "
          "| project exact (s) | project fast (s) | exact vs naive | exact vs best bare | fast vs exact "
          "| max Δc exact | max Δc fast |")
    print("|" + "---|" * 13)
    for n in (int(x) for x in args.sizes.split(",")):
        for padded in (False, True):
            p, mask = matrices(n, padded)
            arrays = p.reshape(-1, n, n).numpy()
            naive = best(lambda: [np.linalg.svd(a, compute_uv=False) for a in arrays], args.repeats)
            bare = best(lambda: torch.linalg.svdvals(p), args.repeats)
            bare_one = best(with_threads(1, lambda: torch.linalg.svdvals(p)), args.repeats)
            times = {}
            for mode in ("exact", "fast"):
                probe = SpectrumProbe(1, p.shape[1], n, n // 4, mode)
                valid = key_valid(mask, p.shape[0], n, p.device)
                times[mode] = best(lambda: probe.add(0, p, valid), args.repeats)
            print(f"| {n} | {'yes' if padded else 'no'} | {naive:.3f} | {bare:.3f} | {bare_one:.3f} "
                  f"| {times['exact']:.3f} | {times['fast']:.3f} | {naive / times['exact']:.2f}× "
                  f"| {min(bare, bare_one) / times['exact']:.2f}× | {times['exact'] / times['fast']:.2f}× "
                  f"| {accuracy(p, lambda m: singular_values(m, 'exact')):.1e} "
                  f"| {accuracy(p, lambda m: singular_values(m, 'fast')):.1e} |", flush=True)


if __name__ == "__main__":
    main()
