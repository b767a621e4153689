"""Reproduce Figure 1 of Linformer (Wang et al. 2020) from scratch and print the numbers the paper states.

Runs `spectra.analyze` for every model × dataset (RoBERTa-base and -large on Wikitext-103 and IMDB,
n = 512, 10k sequences by default), skipping finished runs and resuming interrupted ones, draws the
figure, and prints the heatmap's range (paper: about 0.88–0.96) and the mean c at index n/4 per layer
with the Spearman correlation between layer index and that mean (paper: higher layers are more skewed,
i.e. a positive correlation).

    python analyses/figure1.py                                  # the paper's setting (needs a GPU and the hub)
    python analyses/figure1.py --samples 64 --length 128        # a quick check
    python analyses/figure1.py --models path/to/model --datasets corpus.txt   # local models and text
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

import spectra
from spectra.report.plots import choose_heatmap, figure1
from spectra.report.summaries import c_at, default_at, headline, layer_trend, unique_names


def run_dir(runs_dir: Path, model: str, dataset: str, length: int) -> Path:
    """runs/<model>-<dataset>-n<length>, the same name `spectra analyze` picks by default."""
    model_name = Path(model).name or model
    data_name = Path(dataset).stem if Path(dataset).suffix else dataset
    return runs_dir / f"{model_name.split('/')[-1]}-{data_name}-n{length}"


def ensure_run(model: str, dataset: str, out: Path, args: argparse.Namespace) -> spectra.Run:
    """Load a finished run, else run (or resume) the analysis."""
    if (out / "run.json").is_file():
        run = spectra.load_run(out)
        print(f"using finished run {out} ({run.meta.get('samples')} sequences)", file=sys.stderr)
        return run
    print(f"analysing {model} on {dataset} → {out}", file=sys.stderr)
    return spectra.analyze(
        model, dataset, length=args.length, samples=args.samples, batch_size=args.batch_size, device=args.device,
        out=out, resume=True, progress=None, notify=lambda line: print(line, file=sys.stderr),
    )


def report(runs: list[spectra.Run], heat: spectra.Run) -> None:
    """Print the heatmap range, then the mean c at index n/4 per layer of every run and its layer trend."""
    at = default_at(heat.n)
    numbers = headline(heat, at)
    print(f"Heatmap ({heat.label}, n = {heat.n}, {numbers['sequences']} sequences): c at index {at} ranges "
          f"{numbers['c_min']:.3f}–{numbers['c_max']:.3f}, mean {numbers['c_mean']:.3f} (paper: about 0.88–0.96)")
    names = unique_names(runs)
    table = pd.DataFrame({name: pd.Series(c_at(run, default_at(run.n)).mean(axis=1))
                          for name, run in zip(names, runs)})
    table.index.name = "layer"
    print("\nMean over heads of c at index n/4, per layer:")
    print(table.to_string(float_format=lambda x: f"{x:.3f}", na_rep=""))
    print("\nSpearman rho(layer index, per-layer mean c at n/4); positive = higher layers more skewed (lower rank),")
    print("as the paper states:")
    for name, run in zip(names, runs):
        print(f"  {name}: {layer_trend(c_at(run, default_at(run.n))):+.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10000, help="sequences per run (paper: 10k)")
    parser.add_argument("--length", type=int, default=512, help="sequence length n (paper: 512)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--models", nargs="+", default=["roberta-base", "roberta-large"], help="hub ids or local dirs")
    parser.add_argument("--datasets", nargs="+", default=["wikitext-103", "imdb"], help="named datasets or local files")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=Path("figures/figure1"), help="figure path without suffix")
    args = parser.parse_args(argv)
    try:
        runs = [ensure_run(model, dataset, run_dir(args.runs_dir, model, dataset, args.length), args)
                for model in args.models for dataset in args.datasets]
        heat = choose_heatmap(runs)
        paths = figure1(runs, args.out, heatmap=heat)
    except spectra.SpectraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(path) for path in paths)}\n")
    report(runs, heat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
