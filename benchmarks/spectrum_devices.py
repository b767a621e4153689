"""Where should the singular values run? Every route for one batch of P, on the GPU and on the CPU.

    python benchmarks/spectrum_devices.py [--sizes 256,512] [--sequences 1,8] [--repeats 3]

For each n and each batch of `sequences` × 144 softmax matrices (benchmarks/spectrum.py's matrices:
temperatures 0.5…6 across 12 heads, every other group of 12 padded to 0.7·n, padded rows and columns
zeroed), lying on the GPU as the forward pass leaves them, times every way to get their singular values:
- cpu exact: copy P to the host, then the project's CPU routine (one matrix per core: float64 Gram
  eigenvalues through scipy's LAPACK, the SVD where the error bound asks), i.e. what `--spectrum-device cpu` does;
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
from typing import Callable

import torch
from spectrum import accuracy, best, matrices  # benchmarks/spectrum.py: the same P, timer and Δc

from spectra.capture import key_valid
from spectra.spectrum import masked, singular_values, split_threads

FIGURE1_MATRICES = 2 * 10_000 * (144 + 384)  # two datasets × 10k sequences × (base + large) heads·layers

Route = Callable[[torch.Tensor], torch.Tensor]  # matrices (B, n, n) on the device → σ (B, n)


def padded_batch(n: int, sequences: int, device: torch.device) -> torch.Tensor:
    """sequences × 144 matrices (B, n, n) on `device`, padded rows and columns zeroed as the probe does."""
    p, mask = matrices(n, padded=True, batch=12 * sequences)
    return masked(p, key_valid(mask, p.shape[0], n, p.device)).reshape(-1, n, n).to(device)


def gram_sqrt_eig(g: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh(g).clamp_min(0).sqrt()


def routes(device: torch.device) -> dict[str, Route]:
    cpu: dict[str, Route] = {
        "cpu exact (--spectrum-device cpu)": lambda p: singular_values(p.cpu()),
        "cpu eigvalsh float64 of gram from device": lambda p: torch.cat(
            split_threads(gram_sqrt_eig, (p.mT.double() @ p.double()).cpu())),
    }
    if device.type != "cuda":
        return cpu
    gpu: dict[str, Route] = {
        "gpu svdvals float64 (default driver)": lambda p: torch.linalg.svdvals(p.double()),
        "gpu svdvals float32 (default driver)": lambda p: torch.linalg.svdvals(p),
        "gpu svdvals float32 gesvda": lambda p: torch.linalg.svdvals(p, driver="gesvda"),
        "gpu eigvalsh float64 gram": lambda p: gram_sqrt_eig(p.mT.double() @ p.double()),
        "gpu eigvalsh float32 gram": lambda p: gram_sqrt_eig(p.mT @ p),
        "gpu exact (--spectrum-device same)": lambda p: singular_values(p),
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
            p = padded_batch(n, sequences, device)
            for name, route in routes(device).items():
                try:
                    seconds = best(lambda: route(p), args.repeats)
                    error = accuracy(p, route)
                except (RuntimeError, torch.cuda.OutOfMemoryError) as failure:  # e.g. a driver this build lacks
                    print(f"| {n} | {p.shape[0]} | {name} | failed: {str(failure).splitlines()[0][:80]} | | | |")
                    continue
                rate = p.shape[0] / seconds
                hours = f"{FIGURE1_MATRICES / rate / 3600:.1f}" if n == 512 else "—"
                print(f"| {n} | {p.shape[0]} | {name} | {seconds:.3f} | {rate:.0f} "
                      f"| {error:.1e} | {hours} |", flush=True)


if __name__ == "__main__":
    main()
