"""Where should the singular values run? Every route for one batch of P, on the GPU and on the CPU.

    python benchmarks/spectrum_devices.py [--sizes 256,512] [--sequences 1,8] [--repeats 3]

For each n and each batch of `sequences` × 144 softmax matrices (the 12×12 heads of RoBERTa-base,
temperatures 0.5…6, every other sequence padded to 0.7·n), lying on the GPU as the forward pass leaves
them, times every way to get their singular values:
- cpu exact / cpu fast: copy P to the host, then the project's CPU routine (one single-threaded LAPACK
  call per core: float64 SVD, or float32 Gram eigenvalues with exact fallback), i.e. what
  `--spectrum-device cpu` does;
- cpu eigvalsh(gram from gpu): PᵀP formed on the GPU in float64, copied, eigenvalues on the CPU cores;
- gpu svdvals float64/float32 (torch's default cuSOLVER driver, and gesvda), gpu eigvalsh of the Gram
  matrix in float64/float32, and the project's routine on the GPU (`--spectrum-device same`).
Each line gives seconds per batch, matrices per second, the largest |Δc| against float64 scipy on 8 of
the matrices, and the hours the paper's Figure 1 workload (10.6 million 512×512 spectra) would take at
that rate. Without CUDA only the CPU routes run.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Callable

import numpy as np
import scipy.linalg
import torch

from spectra.spectrum import cumulative, singular_values, split_threads

FIGURE1_MATRICES = 2 * 10_000 * (144 + 384)  # two datasets × 10k sequences × (base + large) heads·layers


def matrices(n: int, sequences: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.5, 6.0, 12).repeat(12)[None, :, None, None]
    mask = torch.zeros(sequences, 1, n, n)
    mask[1::2, ..., int(0.7 * n):] = torch.finfo(torch.float32).min
    p = torch.softmax(torch.randn(sequences, 144, n, n, generator=g) * scale + mask, dim=-1)
    keep = (mask[:, :, :1, :] == 0).float()
    return (p * keep * keep.transpose(-1, -2)).reshape(-1, n, n).to(device)


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, out


def delta_c(sigma: torch.Tensor, reference: np.ndarray, picks: np.ndarray) -> float:
    c = cumulative(sigma[picks].double().cpu().sort(-1, descending=True).values.clamp_min(0)).numpy()
    c_ref = np.cumsum(reference, -1) / reference.sum(-1, keepdims=True)
    return float(np.abs(c - c_ref).max())


def gram_sqrt_eig(g: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh(g).clamp_min(0).sqrt()


def routes(p: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    cpu = {
        "cpu exact (--spectrum-device cpu)": lambda: singular_values(p.cpu(), "exact"),
        "cpu fast": lambda: singular_values(p.cpu(), "fast"),
        "cpu eigvalsh float64 of gram from device": lambda: torch.cat(
            split_threads(gram_sqrt_eig, (p.mT.double() @ p.double()).cpu())),
    }
    if p.device.type != "cuda":
        return cpu
    gpu = {
        "gpu svdvals float64 (default driver)": lambda: torch.linalg.svdvals(p.double()),
        "gpu svdvals float32 (default driver)": lambda: torch.linalg.svdvals(p),
        "gpu svdvals float32 gesvda": lambda: torch.linalg.svdvals(p, driver="gesvda"),
        "gpu eigvalsh float64 gram": lambda: gram_sqrt_eig(p.mT.double() @ p.double()),
        "gpu eigvalsh float32 gram": lambda: gram_sqrt_eig(p.mT @ p),
        "gpu exact (--spectrum-device same)": lambda: singular_values(p, "exact"),
        "gpu fast (--spectrum-device same)": lambda: singular_values(p, "fast"),
    }
    return {**cpu, **gpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,512")
    parser.add_argument("--sequences", default="1,8", help="sequences per batch (144 matrices each)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "none"
    print(f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads; gpu: {gpu}; "
          f"torch {torch.__version__}")
    print("| n | matrices | route | s per batch | matrices/s | max Δc | Figure 1 at this rate (h) |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        for sequences in (int(x) for x in args.sequences.split(",")):
            p = matrices(n, sequences, device)
            picks = np.linspace(0, p.shape[0] - 1, 8).astype(int)
            reference = np.stack([scipy.linalg.svdvals(m) for m in p[picks].double().cpu().numpy()])
            for name, fn in routes(p).items():
                try:
                    seconds, sigma = timed(fn, args.repeats)
                except (RuntimeError, torch.cuda.OutOfMemoryError) as error:  # e.g. a driver this build lacks
                    print(f"| {n} | {p.shape[0]} | {name} | failed: {str(error).splitlines()[0][:80]} | | | |")
                    continue
                rate = p.shape[0] / seconds
                hours = f"{FIGURE1_MATRICES / rate / 3600:.1f}" if n == 512 else "—"
                print(f"| {n} | {p.shape[0]} | {name} | {seconds:.3f} | {rate:.0f} "
                      f"| {delta_c(sigma, reference, picks):.1e} | {hours} |", flush=True)


if __name__ == "__main__":
    main()
