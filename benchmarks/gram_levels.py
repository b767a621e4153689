"""Which attention matrices the batched route's Gram bound sends on, and what each level's error really is.

    python benchmarks/gram_levels.py [--model .gpu/minilm16] [--length 512] [--threads 1]

For one sequence of n tokens through two encoders — the Figure 1 workload's RoBERTa-base-shaped one with random
weights (benchmarks/gpu/figure1.py: std 0.06, the tests' pseudo-text) and a real one (MiniLM from
`benchmarks/gpu/prepare.py`, the licence texts) — P of every layer and head (eager attention, float32, on the CPU),
then, per model:
- each layer's mean largest probability of a row (1/n is uniform attention);
- at each declared tolerance, how many matrices fail the float64 Gram bound (`spectra.batched.loss`), which the
  route then solves from their Jordan–Wielandt matrices;
- for up to --show of those: the Gram bound beside the Gram route's actual error in c against scipy's SVD, and the
  Jordan–Wielandt bound beside its actual error, with its largest |Δσ| in units of u·σ₁.
The solver is LAPACK's (torch's eigvalsh), the GPU route's arithmetic on the CPU: the shares are the model's, not
the device's. Why it exists: the Figure 1 workload stalled on an H200 (RESULTS.md, "GPU, fifth lease").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy.linalg
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import figure1  # noqa: E402  (benchmarks/gpu/figure1.py: the workload's random encoder)
import tiny  # noqa: E402

from spectra import batched  # noqa: E402
from spectra.spectrum import GRAM_ERROR, cumulative  # noqa: E402


def attention(folder: str | Path, text: str, n: int) -> torch.Tensor:
    """P (layers · heads, n, n), float64, of the first n tokens of text."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    ids = AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt", truncation=True, max_length=n)["input_ids"]
    if ids.shape[1] < n:
        raise SystemExit(f"the text gives {ids.shape[1]} tokens, fewer than --length {n}")
    with torch.no_grad():
        maps = model(ids, output_attentions=True).attentions
    return torch.stack([m[0] for m in maps]).reshape(-1, n, n).double()


def curve_error(sigma: torch.Tensor, reference: np.ndarray) -> np.ndarray:
    return np.abs(cumulative(sigma).numpy() - cumulative(torch.from_numpy(reference)).numpy()).max(-1)


def report(name: str, p: torch.Tensor, heads: int, show: int) -> None:
    n = p.shape[-1]
    print(f"\n{name}: {len(p)} matrices of {n} × {n}")
    largest = p.amax(-1).mean(-1).reshape(-1, heads).mean(-1)
    print("mean largest probability of a row, per layer (uniform: %.4f): %s"
          % (1 / n, " ".join(f"{value:.3f}" for value in largest.tolist())))
    ranks = torch.full((len(p),), n)
    eigenvalues = torch.linalg.eigvalsh(p @ p.mT)
    bound = batched.loss(eigenvalues, ranks, batched.UNIT[torch.float64], GRAM_ERROR)
    for tolerance in figure1.TOLERANCES:
        print(f"tolerance {tolerance:.0e}: {int((bound > tolerance / 2).sum())} of {len(p)} fail the float64 Gram "
              "bound (to Jordan–Wielandt)")
    hard = torch.nonzero(bound > batched.EXACT / 2).flatten()[:show]
    if not len(hard):
        return
    reference = np.stack([scipy.linalg.svdvals(m) for m in p[hard].numpy()])
    gram = curve_error(eigenvalues[hard].clamp_min(0).sqrt().flip(-1), reference)
    sigma, jordan = batched.jordan_sigma(p[hard], ranks[hard], torch.linalg.eigvalsh)
    moved = (np.abs(sigma.numpy() - reference) / (2.0**-53 * reference[:, :1])).max()
    print("| matrix | Gram bound | Gram error | Jordan–Wielandt bound | Jordan–Wielandt error |")
    print("|---|---|---|---|---|")
    for row, index in enumerate(hard.tolist()):
        print(f"| {index} | {bound[index]:.1e} | {gram[row]:.1e} | {jordan[row]:.1e} | "
              f"{curve_error(sigma[row:row + 1], reference[row:row + 1])[0]:.1e} |")
    print(f"Jordan–Wielandt: max |Δσ| = {moved:.1f}·u·σ₁ (the bound takes {batched.jordan_error(2 * n):.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=".gpu/minilm16", help="a real encoder's folder (prepare.py's MiniLM)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--show", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp())
    random = figure1.roberta_base(root, args.length, 0.06)
    report("RoBERTa-base shape, random weights (std 0.06)",
           attention(random, " ".join(tiny.corpus_lines(args.length)), args.length), 12, args.show)
    if Path(args.model).exists():
        text = Path("/usr/share/common-licenses/GPL-3").read_text()
        report(f"{args.model} (real weights), GPL-3's text", attention(args.model, text, args.length), 12,
               args.show)


if __name__ == "__main__":
    main()
