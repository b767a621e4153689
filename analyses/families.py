"""Head to head: which efficient-attention family best stands in for a pretrained model's attention at equal k?

Runs `spectra.api.approx` for every model × dataset (roberta-base on Wikitext-103 and IMDB, n = 512,
k ∈ {32, 64, 128, 256} by default) with svd (the rank-k oracle), linformer(kv), pool-mean, performer,
nystrom (exact pseudo-inverse) and nystrom-iter6 (as Nyströmformer runs it), skyformer and probsparse, per
head and end to end (every layer substituted), skipping finished runs and
resuming interrupted ones. It then prints, per method and k, the per-head output error ‖PV − Ṽ‖/‖PV‖ (mean
over sequences, then over layers and heads), its median head, the P error, the hidden-state drift and the
masked-LM perplexity, writes that table as CSV, and draws the per-head output error and the perplexity
against k (figures/families.png at 200 dpi and .pdf). The budget is comparable across methods: k projected
length = k random features = k landmarks = k active queries (docs/methods.md).

    python analyses/families.py                                       # the full recipe (a GPU and the hub)
    python analyses/families.py --samples 64 --length 128 --budgets 8,16,32,64        # a quick check
    python analyses/families.py --models path/to/model --datasets corpus.txt --device cpu
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

import spectra
from spectra.api import approx
from spectra.report.plots.style import save
from spectra.report.approx import ApproxRun

METHODS = ("svd", "linformer(kv)", "pool-mean", "performer", "nystrom", "nystrom-iter6", "skyformer", "probsparse")
MARKERS = "osD^vP*Xh<>"


def run_dir(runs_dir: Path, model: str, dataset: str, length: int) -> Path:
    """runs/<model>-<dataset>-n<length>-families."""
    model_name = (Path(model).name or model).split("/")[-1]
    data_name = Path(dataset).stem if Path(dataset).suffix else dataset
    return runs_dir / f"{model_name}-{data_name}-n{length}-families"


def ensure_run(model: str, dataset: str, out: Path, args: argparse.Namespace) -> ApproxRun:
    """Load a finished run (it must cover the asked methods and budgets), else run or resume it."""
    if (out / "run.json").is_file():
        run = spectra.load_run(out)
        missing = (({*args.methods} - {*run.meta.get("methods", [])})
                   | ({*args.budgets} - {*run.meta.get("budget", [])}))
        if not isinstance(run, ApproxRun) or missing or not run.meta.get("end_to_end"):
            raise spectra.SpectraError(f"{out} is a finished run without {sorted(map(str, missing)) or 'end-to-end'}; "
                                       "remove it or pass another --runs-dir")
        print(f"using finished run {out} ({run.meta.get('samples')} sequences)", file=sys.stderr)
        return run
    print(f"approximating {model} on {dataset} → {out}", file=sys.stderr)
    return approx(model, dataset, budget=args.budgets, methods=args.methods, end_to_end=True, length=args.length,
                  samples=args.samples, batch_size=args.batch_size, seed=args.seed, device=args.device, out=out,
                  resume=True, progress=None, notify=lambda line: print(line, file=sys.stderr))


def summary(run: ApproxRun) -> pd.DataFrame:
    """One row per (method, budget): per-head errors averaged over layers and heads, then end to end."""
    heads = run.head_stats.pivot_table(index=["method", "budget", "layer", "head"], columns="metric", values="mean")
    per_head = heads.groupby(["method", "budget"], sort=False)
    table = per_head.mean()[["out_err", "p_err"]]
    table.insert(1, "out_err_median_head", per_head["out_err"].median())
    e2e = run.end_to_end.set_index(["method", "budget"])
    keep = [column for column in ("hidden_rel_err", "ppl_exact", "ppl", "ppl_change") if column in e2e.columns]
    table = table.join(e2e[keep])
    order = {label: i for i, label in enumerate(run.meta["methods"])}
    table = table.reset_index().sort_values(["method", "budget"],
                                            key=lambda c: c.map(order) if c.name == "method" else c)
    table.insert(0, "run", run.label)
    return table.reset_index(drop=True)


def draw(tables: list[pd.DataFrame], n: int):
    """Per-head output error (top) and masked-LM perplexity (bottom, else hidden drift) against k."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10.5, "legend.fontsize": 9, "pdf.fonttype": 42})
    methods = list(dict.fromkeys(label for table in tables for label in table["method"]))
    colors = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(methods)}
    figure, axes = plt.subplots(2, len(tables), figsize=(max(4.6 * len(tables), 8.0) + 0.6, 7.6), squeeze=False)
    for column, table in enumerate(tables):
        top, bottom = axes[0, column], axes[1, column]
        has_ppl = "ppl" in table.columns
        for i, (label, rows) in enumerate(table.groupby("method", sort=False)):
            style = dict(color=colors[label], marker=MARKERS[i % len(MARKERS)], markersize=5, linewidth=1.6,
                         label=label)
            top.plot(rows["budget"], rows["out_err"], **style)
            bottom.plot(rows["budget"], rows["ppl" if has_ppl else "hidden_rel_err"], **style)
        if has_ppl:
            bottom.axhline(table["ppl_exact"].iloc[0], color="black", linestyle="--", linewidth=1.2,
                           label="exact model")
        budgets = sorted(table["budget"].unique())
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(budgets, [str(b) for b in budgets])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.grid(True, which="major", alpha=0.3)
            ax.set_xlabel("budget k")
        low, high = bottom.get_ylim()
        subs = (1.0, 2.0, 5.0) if high / low > 10 else (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
        bottom.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
        bottom.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        bottom.yaxis.set_minor_formatter(NullFormatter())
        top.set_title(f"{table['run'].iloc[0]}, n = {n}")
        if column == 0:
            top.set_ylabel("per-head output error ‖PV − Ṽ‖/‖PV‖\n(mean over layers and heads)")
            bottom.set_ylabel("masked-LM perplexity\n(all layers substituted)" if has_ppl else
                              "hidden-state drift ‖H − H̃‖/‖H‖\n(all layers substituted)")
    handles, labels = axes[1, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), frameon=False,
                  title="k = projected length (svd, linformer, pool) = random features (performer) = "
                        "landmarks (nystrom, skyformer) = active queries (probsparse)",
                  title_fontsize=9)
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000, help="sequences per run")
    parser.add_argument("--length", type=int, default=512, help="sequence length n")
    parser.add_argument("--budgets", default="32,64,128,256", help="comma-separated budgets k, each ≤ n")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated approx methods")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--models", nargs="+", default=["roberta-base"], help="hub ids or local dirs")
    parser.add_argument("--datasets", nargs="+", default=["wikitext-103", "imdb"], help="named datasets or local files")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=Path("figures/families"), help="figure path without suffix")
    args = parser.parse_args(argv)
    try:
        args.budgets = [int(part) for part in args.budgets.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--budgets '{args.budgets}' is not a comma-separated list of integers")
    args.methods = [part.strip() for part in args.methods.split(",") if part.strip()]
    try:
        runs = [ensure_run(model, dataset, run_dir(args.runs_dir, model, dataset, args.length), args)
                for model in args.models for dataset in args.datasets]
        tables = [summary(run) for run in runs]
        paths = save(draw(tables, args.length), args.out)
    except spectra.SpectraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    table = pd.concat(tables, ignore_index=True)
    csv = args.out.with_name(args.out.name + ".csv")
    table.to_csv(csv, index=False)
    print(f"wrote {', '.join(str(path) for path in [*paths, csv])}\n")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        for name, rows in table.groupby("run", sort=False):
            print(f"{name}, n = {args.length}: per-head output error (mean over layers and heads) and end to end")
            print(rows.drop(columns="run").to_string(index=False, float_format=lambda v: f"{v:.4g}"), "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
