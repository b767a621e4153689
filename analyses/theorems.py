"""Theorems 1 and 2 of Linformer (Wang et al. 2020) on roberta-base's attention over IMDB at n = 512.

Runs `spectra.api.theorems` (skipping a finished run, resuming an interrupted one), draws
`plot_theorems` into --out, and prints the headline: for every method of the pooled tables (jl, svd,
linformer(<sharing>), theorem2(<delta>) relative to ‖softmax(w)V‖ and to the theorem's right side) the
smallest k of the sweep whose median relative error is ≤ 0.1, and how far the theorems' k(ε = 0.1) —
Theorem 1's 5 ln n/(ε² − ε³) for jl and svd, Theorem 2's min(9d ln d, 5 ln n)/ε² for the rest — are
from it (ratio k_theory / k needed).

    python analyses/theorems.py                                    # the full setting (a GPU and the hub)
    python analyses/theorems.py --samples 8 --length 128 --budgets 16,32,64,128
    python analyses/theorems.py --model path/to/model --data corpus.txt --length 32 --budgets 4,8,16,32
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

import spectra
from spectra.api import theorems
from spectra.config import RunConfig
from spectra.report.theorems import plot_theorems
from spectra.report.summaries import theorem_errors
from spectra.report.theorems import TheoremRun
from spectra.theory.bounds import theorem1_k, theorem2_k

EPS = 0.1  # the headline's relative error


def run_dir(runs_dir: Path, model: str, data: str, length: int) -> Path:
    """runs/<model>-<data>-n<length>-theorems, the name `spectra theorems` picks by default."""
    return runs_dir / RunConfig(model, data, length).default_out("theorems").name


def ensure_run(args: argparse.Namespace) -> TheoremRun:
    """Load a finished run, else run (or resume) the theorems."""
    out = run_dir(args.runs_dir, args.model, args.data, args.length)
    if (out / "run.json").is_file():
        run = spectra.load_run(out)
        print(f"using finished run {out} ({run.meta.get('samples')} sequences)", file=sys.stderr)
        return run
    print(f"theorems on {args.model} over {args.data} → {out}", file=sys.stderr)
    return theorems(args.model, args.data, budget=args.budgets, eps=args.eps, length=args.length,
                    samples=args.samples, batch_size=args.batch_size, device=args.device, out=out, resume=True,
                    progress=None, notify=lambda line: print(line, file=sys.stderr))


def errors(run: TheoremRun) -> pd.DataFrame:
    """Every method of the pooled tables, per k: label, theorem (1 or 2), budget, median."""
    output = theorem_errors(run, "output")
    rhs = theorem_errors(run, "rhs")
    rhs = rhs[rhs["label"].str.startswith("theorem2(")].assign(label=lambda f: f["label"] + " vs rhs")
    table = pd.concat([output, rhs], ignore_index=True)
    table["theorem"] = [1 if label in ("jl", "svd") else 2 for label in table["label"]]
    return table[["label", "theorem", "budget", "median"]]


def k_theory(run: TheoremRun, theorem: int, eps: float = EPS) -> float:
    """Theorem 1's or Theorem 2's k(ε) at the run's n (and head dimension d)."""
    n = int(run.tables["theorem1"]["n"].iloc[0])
    if theorem == 1:
        return theorem1_k(eps, n)
    d = run.tables["theorem2"]["d"].iloc[0]
    return theorem2_k(eps, n, int(d)) if pd.notna(d) else math.nan


def headline(run: TheoremRun, eps: float = EPS) -> pd.DataFrame:
    """Per method: the smallest k of the sweep with median error ≤ eps (NaN if none), its theorem's k(eps) and
    the ratio k(eps) / k needed (when k is not reached: an upper bound, k(eps) / the largest k)."""
    table = errors(run)
    rows = []
    for label, group in table.groupby("label", sort=False):
        theorem = int(group["theorem"].iloc[0])
        reached = group.loc[group["median"] <= eps, "budget"]
        needed = float(reached.min()) if len(reached) else math.nan
        theory = k_theory(run, theorem, eps)
        bound = theory / (needed if len(reached) else group["budget"].max())
        rows.append({"method": label, "theorem": theorem, "k_needed": needed, "k_theory": theory,
                     "ratio": bound, "reached": bool(len(reached))})
    return pd.DataFrame(rows)


def report(run: TheoremRun, eps: float = EPS) -> None:
    """Print the headline table."""
    n = int(run.tables["theorem1"]["n"].iloc[0])
    sweep = ", ".join(str(k) for k in sorted(run.tables["theorem1"]["budget"].unique()))
    print(f"{run.label}, n = {n}, {run.meta.get('samples')} sequences, k in {{{sweep}}}")
    print(f"Smallest k with median relative error ≤ {eps:g}, against the theorems' k(ε = {eps:g}) "
          f"(Theorem 1: 5 ln n/(ε² − ε³) = {k_theory(run, 1, eps):,.0f}; "
          f"Theorem 2: min(9d ln d, 5 ln n)/ε² = {k_theory(run, 2, eps):,.0f}):")
    largest = max(run.tables["theorem1"]["budget"])
    for row in headline(run, eps).itertuples(index=False):
        if row.reached:
            verdict = f"k = {row.k_needed:.0f}; Theorem {row.theorem}'s k is {row.ratio:,.1f}× that"
        else:
            verdict = (f"not in the sweep (needs k > {largest}); Theorem {row.theorem}'s k is < {row.ratio:,.1f}× "
                       "the k needed")
        print(f"  {row.method:<28} {verdict}")
    print("(jl, svd: per column w of V, ‖P̃w − Pw‖/‖Pw‖; linformer, theorem2: per row, relative to ‖softmax(w)V‖,"
          " or with 'vs rhs' to Theorem 2's right side ‖softmax(w)‖‖V‖_F)")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="roberta-base", help="hub id or local model directory")
    parser.add_argument("--data", default="imdb", help="named dataset or local text file")
    parser.add_argument("--samples", type=int, default=100, help="sequences")
    parser.add_argument("--length", type=int, default=512, help="sequence length n")
    parser.add_argument("--budgets", type=_ints, default=[16, 32, 64, 128, 256, 512], help="k sweep, e.g. 16,32,64")
    parser.add_argument("--eps", type=_floats, default=[0.1, 0.2, 0.3, 0.5], help="ε values of Pr(error ≤ ε)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=Path("figures/theorems"), help="directory for the figures")
    args = parser.parse_args(argv)
    try:
        run = ensure_run(args)
        paths = plot_theorems(run, args.out)
    except spectra.SpectraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(path) for path in paths)}\n")
    report(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
