"""What fitting Linformer projections to a frozen model costs, per layer: PCA (closed form) and Adam steps.

    python benchmarks/fitting.py [--shapes 64x12x128x32,16x12x512x64] [--budgets 16,32,64,128]
                                 [--sharing headwise,kv] [--steps 20] [--threads 2]

A shape is S×H×n×d: calibration sequences S, heads H, length n, head dimension d (64×12×128×32 is
`spectra approx --fit-samples 64` on all-MiniLM-L6-v2 at n = 128; 16×12×512×64 a BERT-base layer at
n = 512). q, k, v are seeded Gaussian with a shared low-rank part, so attention is peaked as in real
models; the cost does not depend on the values. Per (shape, budget, sharing): seconds for the PCA
projections with their scale search, seconds per Adam step of `fit_projections` (forward and backward of
eq. 7 over every sequence and head, the held-out error included), and the calibration's memory. A whole
`linformer-fit` at the default 200 steps costs about 200 × the step time per layer and budget. Timings
are the best of two runs in this process, on `--threads` torch threads.
"""

from __future__ import annotations

import argparse
import time

import torch

from spectra.nn.calibration import Calibration
from spectra.nn.fit import fit_projections, pca_projections


def calibration(shape: tuple[int, int, int, int], seed: int = 0) -> Calibration:
    sequences, heads, n, d = shape
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, heads, n, 4, generator=g) @ torch.randn(4, d, generator=g)

    def draw() -> torch.Tensor:
        return shared * 2 + torch.randn(sequences, heads, n, d, generator=g)

    return Calibration(0, draw(), draw(), draw(), torch.ones(sequences, n, dtype=torch.bool), d ** -0.5)


def best(run, repeats: int = 2) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x12x128x32,16x12x512x64")
    parser.add_argument("--budgets", default="16,32,64,128")
    parser.add_argument("--sharing", default="headwise,kv")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| S×H×n×d | budget | sharing | calibration MiB | PCA s | Adam s/step | 200-step fit s (est.) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for text in args.shapes.split(","):
        shape = tuple(int(part) for part in text.split("x"))
        calib = calibration(shape)
        calib.target  # formed once, as the probe does before fitting
        n = shape[2]
        for budget in (int(b) for b in args.budgets.split(",") if int(b) < n):
            for sharing in args.sharing.split(","):
                pca = best(lambda: pca_projections([calib], 1, shape[1], budget, n, sharing))
                fit = best(lambda: fit_projections([calib], 1, shape[1], budget, n, sharing, steps=args.steps))
                per_step = fit / (args.steps + 1)  # steps + the initial evaluation
                print(f"| {text} | {budget} | {sharing} | {calib.nbytes / 2**20:.0f} | {pca:.2f} | {per_step:.3f} "
                      f"| {per_step * 201:.0f} |", flush=True)


if __name__ == "__main__":
    main()
