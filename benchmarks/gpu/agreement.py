"""Capture and spectra on the GPU against the CPU, on the same real weights and text.

    python benchmarks/gpu/agreement.py [--model .gpu/minilm16] [--data .gpu/corpus.txt] [--length 512]
                                       [--samples 32]

all-MiniLM-L6-v2 (its weights stored in float16 by prepare.py) analysed with `spectra analyze` four times on the
same sequences: on the CPU in float32 (the reference), on the GPU in float32 with the spectra on the GPU
(`--spectrum-device same`) and on the CPU (`cpu`, through pinned copies and the worker), and on the GPU in float16
and bfloat16 (the capture in the model's dtype, the spectra in float64 as always). Printed per layer: c at index
n/4 (128 at n = 512) averaged over heads and sequences on the CPU, and the largest |Δc| over the layer's heads of
each GPU run against it; then the tolerance each is held to — float32 on either device differs by the rounding of
P (≤ 1e-5), float16 and bfloat16 by that of q, k and P in 10 and 7 mantissa bits (≤ 1e-3, ≤ 1e-2; on the CPU,
n = 128, MiniLM showed 8e-5 and 1.3e-3; on an H100, n = 512, 8.1e-5 and 1.5e-3) — and whether it held (exit 1 when
not).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

import spectra



def runs(device: str) -> dict[str, tuple[dict, float]]:
    """Each run against the CPU's float32 one: its options and the largest |Δc| it may show (`device` cpu only to
    try the script where no GPU is)."""
    return {f"{device} float32, spectra on {device}": (dict(device=device, spectrum_device="same"), 1e-5),
            f"{device} float32, spectra on cpu": (dict(device=device, spectrum_device="cpu"), 1e-5),
            f"{device} float16": (dict(device=device, dtype="float16"), 1e-3),
            f"{device} bfloat16": (dict(device=device, dtype="bfloat16"), 1e-2)}


def c_at(model: str, data: str, out: Path, length: int, samples: int, **options) -> tuple[pd.Series, float]:
    """c at n/4 per (layer, head) of one run, and its seconds."""
    start = time.perf_counter()
    run = spectra.analyze(model, data, length=length, samples=samples, batch_size=8, out=out, progress=None,
                          notify=lambda line: None, **options)
    seconds = time.perf_counter() - start
    return pd.read_csv(run.path / "metrics.csv").set_index(["layer", "head"])["c_at_mean"], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=".gpu/minilm16")
    parser.add_argument("--data", default=".gpu/corpus.txt")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    chosen = runs(args.device)
    root = Path(tempfile.mkdtemp())
    reference, seconds = c_at(args.model, args.data, root / "cpu", args.length, args.samples, device="cpu")
    print(f"MiniLM (float16 weights), n = {args.length}, {args.samples} sequences; cpu float32: {seconds:.1f} s",
          flush=True)
    differences: dict[str, pd.Series] = {}
    for name, (options, _) in chosen.items():
        got, seconds = c_at(args.model, args.data, root / name.replace(" ", "_").replace(",", ""), args.length,
                            args.samples, **options)
        differences[name] = (got - reference).abs().groupby(level="layer").max()
        print(f"{name}: {seconds:.1f} s", flush=True)
    print(f"\n| layer | c@{args.length // 4} (cpu float32) | "
          + " | ".join(f"max |Δc| {name}" for name in chosen) + " |")
    print("|---|---|" + "---|" * len(chosen))
    for layer, value in reference.groupby(level="layer").mean().items():
        print(f"| {layer} | {value:.6f} | " + " | ".join(f"{differences[name][layer]:.1e}" for name in chosen) + " |")
    failed = [name for name, (_, tolerance) in chosen.items() if differences[name].max() > tolerance]
    print("\ntolerances: " + ", ".join(f"{name} ≤ {tolerance:.0e}" for name, (_, tolerance) in chosen.items())
          + (f"; NOT HELD: {', '.join(failed)}" if failed else "; all held"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
