"""The `spectra` command: thin typer commands over the Python API.

Starts fast: this module imports only typer and `spectra.config` (choice sets, no torch); each command
imports what it needs when it runs.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

import click
import typer

from .cli_options import (USAGE_ERRORS, BatchSize, Data, DeviceOption, DTypeOption, FlaglessCommand, FlaglessGroup,
                          GGUFFile, ModeOption, Out, Overwrite, Resume, Seed, Split, TextColumn, TrustRemoteCode)
from .config import Device, DType, FitInit, Mode, Place, Projection, Spectrum
from .errors import Interrupted, SpectraError
from .inputs import numbers

app = typer.Typer(
    cls=FlaglessGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Empirical spectral analysis of the attention of pretrained transformers (Linformer, Wang et al. 2020).",
)


def _version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"spectra {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Empirical spectral analysis of the attention of pretrained transformers (Linformer, Wang et al. 2020)."""


def _notify(line: str) -> None:
    print(line, file=sys.stderr)


@app.command(cls=FlaglessCommand)
def analyze(
    model: str = typer.Argument(..., help="Hugging Face hub id (roberta-base) or a local directory saved with save_pretrained."),
    data: Data = "imdb",
    length: int = typer.Option(512, "--length", help="Sequence length n, special tokens included; at most what the model can embed."),
    samples: int = typer.Option(10000, "--samples", help="Number of sequences; fewer if the corpus yields fewer (said at the end)."),
    mode: ModeOption = Mode.PACK,
    batch_size: BatchSize = 8,
    seed: Seed = 0,
    split: Split = None,
    text_column: TextColumn = None,
    at: Optional[int] = typer.Option(None, "--at", help="1-based singular-value index for c@index and the heatmap (default n/4: 128 for n = 512)."),
    spectrum: Spectrum = typer.Option(Spectrum.EXACT, "--spectrum", help="exact: c within 1e-6 of a float64 SVD (√eig of the float64 Gram matrix PᵀP, the SVD where its error bound asks); fast: the float32 Gram matrix, c within ~2.6e-4, faster only on peaked attention."),
    spectrum_device: Place = typer.Option(Place.AUTO, "--spectrum-device", help="Where the singular values are computed: auto (GPU models: time the first layer on the GPU and on the CPU, keep the faster; CPU/MPS models: cpu), cpu, or same (the model's device). Speed only: the numbers change by rounding at most."),
    overlap: Optional[bool] = typer.Option(None, "--overlap/--no-overlap", help="Compute the spectra on a background thread while the forward pass goes on (default: when they run off the model's device)."),
    qkv: Optional[bool] = typer.Option(None, "--qkv/--no-qkv", help="Also the spectra of queries, keys and values (before and after RoPE): rank for 90%/99% of the energy per sequence and over the run (default: on for decoders)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Spectra of these layers only, e.g. 0,14,29 or 0-5 (long sequences: each spectrum costs O(n³))."),
    heads: Optional[str] = typer.Option(None, "--heads", help="Spectra of these heads only, e.g. 0-3."),
    bootstrap: int = typer.Option(0, "--bootstrap", help="Keep this many Poisson-bootstrap replicates of the mean ranks (for confidence intervals; spectra scaling uses them)."),
    device: DeviceOption = Device.AUTO,
    dtype: DTypeOption = DType.FLOAT32,
    gguf_file: GGUFFile = None,
    out: Out = None,
    overwrite: Overwrite = False,
    resume: Resume = False,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Singular spectra of the context mapping matrix P for every layer and head, averaged over sequences."""
    from .api import analyze as run_analyze
    from .report.console import print_analyze, progress_bar

    with progress_bar("sequences") as progress:
        run = run_analyze(
            model, data, length=length, samples=samples, mode=mode, batch_size=batch_size, seed=seed, split=split,
            text_column=text_column, at=at, spectrum=spectrum, spectrum_device=spectrum_device, overlap=overlap,
            qkv=qkv, layers=layers, heads=heads, bootstrap=bootstrap, device=device, dtype=dtype, gguf_file=gguf_file,
            out=out, overwrite=overwrite, resume=resume,
            trust_remote_code=trust_remote_code, progress=progress, notify=_notify,
        )
    print_analyze(run)


def _saved(ctx: typer.Context, model: str | None, kind: type, wrong: str):
    """The finished run at `model` when it is a run directory of `kind` (else None); another kind is an error,
    and so is any option given with it that a saved run cannot honour (only --plot applies to one)."""
    from .runs import load_run

    if model is None or not Path(model, "run.json").is_file():
        return None
    run = load_run(model)
    if not isinstance(run, kind):
        raise SpectraError(f"{model} {wrong}")
    given = [f"--{name.replace('_', '-')}" for name, value in ctx.params.items()
             if name not in ("model", "plot") and ctx.get_parameter_source(name).name == "COMMANDLINE"]
    if given:
        raise SpectraError(f"{model} is a saved run: {', '.join(given)} cannot change it (only --plot applies); "
                           "to analyse again, give the model and another --out")
    return run


def _report(run, show, plot: bool, plotter: str) -> None:
    """Print a run's tables, draw its plots (`spectra.report.plots.<plotter>`, imported only then) when asked, and
    say where the run lives."""
    from .report.console import out as stdout

    show(run)
    if plot:
        from .report import plots

        for path in getattr(plots, plotter)(run):
            stdout.print(f"wrote {path}", soft_wrap=True)
    stdout.print(f"results in {run.path}")


@app.command(cls=FlaglessCommand)
def approx(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="Hub id or model directory to evaluate, or an approx run directory to re-plot with --plot."),
    data: Data = "imdb",
    k: Optional[str] = typer.Option(None, "--k", help="Budget(s) k, comma-separated: projected length = features = landmarks = active queries; each ≤ n (default 128)."),
    methods: Optional[str] = typer.Option(None, "--methods", help="Comma-separated methods (default svd,jl,linformer,pool-mean,pool-max); 'linformer' means all four sharing levels, 'linformer(kv)' one."),
    end_to_end: bool = typer.Option(False, "--end-to-end", help="Also substitute each approximation into the forward pass: hidden-state drift and masked-LM perplexity."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Layers to substitute with --end-to-end, e.g. 6-11 or 0,3,5-7 (default all)."),
    target: float = typer.Option(0.1, "--target", help="Relative output error per layer whose smallest reaching k is reported."),
    projection: Projection = typer.Option(Projection.GAUSSIAN, "--projection", help="Random projections of jl/linformer: gaussian N(0, 1/k) or orthogonal."),
    fixed_projection: bool = typer.Option(False, "--fixed-projection", help="One random draw per layer and k for the whole run (default: each sequence draws its own, so means come with an interval over the randomness)."),
    fit_samples: int = typer.Option(0, "--fit-samples", help="Calibration sequences for the fitted methods (linformer-pca/-fit, fastformer-fit), read first; --samples more are evaluated after them."),
    fit_steps: int = typer.Option(200, "--fit-steps", help="Adam steps of linformer-fit and fastformer-fit (the best step on held-out calibration sequences is kept)."),
    fit_lr: float = typer.Option(0.1, "--fit-lr", help="The fits' learning rate, relative to each fitted parameter's typical entry."),
    fit_init: FitInit = typer.Option(FitInit.POOLING, "--fit-init", help="Where linformer-fit starts: mean pooling or the PCA projections."),
    k_plan: Optional[Path] = typer.Option(None, "--k-plan", help="A k plan from spectra plan-k: each layer at its own k, beside a uniform k of equal total cost."),
    length: int = typer.Option(512, "--length", help="Sequence length n, special tokens included."),
    samples: int = typer.Option(1000, "--samples", help="Number of sequences."),
    mode: ModeOption = Mode.PACK,
    batch_size: BatchSize = 8,
    seed: Seed = 0,
    split: Split = None,
    text_column: TextColumn = None,
    device: DeviceOption = Device.AUTO,
    dtype: DTypeOption = DType.FLOAT32,
    gguf_file: GGUFFile = None,
    out: Out = None,
    overwrite: Overwrite = False,
    resume: Resume = False,
    plot: bool = typer.Option(False, "--plot", help="Draw the run's plots (error vs layer, error vs k, perplexity vs k) into the run directory's figures/."),
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """How well cheap approximations stand in for a model's attention at budget k: per head and end to end."""
    from .api import DEFAULT_METHODS, approx as run_approx
    from .report.console import print_approx, progress_bar
    from .runs import ApproxRun

    run = _saved(ctx, model, ApproxRun, "is not an approx run; re-plot analyze runs with 'spectra plot'")
    if run is None:
        with progress_bar("sequences") as progress:
            run = run_approx(
                model, data, budgets=numbers(k, "--k") if k is not None else None, methods=methods or DEFAULT_METHODS,
                end_to_end=end_to_end, layers=layers, target=target, projection=projection,
                fixed_projection=fixed_projection, fit_samples=fit_samples, fit_steps=fit_steps, fit_lr=fit_lr,
                fit_init=fit_init, k_plan=k_plan, length=length,
                samples=samples, mode=mode, batch_size=batch_size, seed=seed, split=split, text_column=text_column,
                device=device, dtype=dtype, gguf_file=gguf_file, out=out, overwrite=overwrite, resume=resume,
                trust_remote_code=trust_remote_code, progress=progress, notify=_notify,
            )
    _report(run, print_approx, plot, "plot_approx")


@app.command(cls=FlaglessCommand)
def theorems(
    ctx: typer.Context,
    model: Optional[str] = typer.Argument(None, help="Hub id or model directory (omit with --synthetic), or a theorems run directory to re-plot with --plot."),
    data: Data = "imdb",
    k: Optional[str] = typer.Option(None, "--k", help="Projected dimensions k to sweep, comma-separated, each ≤ n (default 16,32,64,128,256)."),
    eps: str = typer.Option("0.1,0.2,0.3,0.5", "--eps", help="Relative errors ε in (0, 1), comma-separated."),
    synthetic: bool = typer.Option(False, "--synthetic", help="Use i.i.d. Gaussian q, k, v instead of a model (with --n, --d, --heads)."),
    draws: int = typer.Option(1, "--draws", help="Random projections R (and E, F) drawn per sequence, each seeded by the sequence's index: Pr(error ≤ ε) comes with a 95% interval over sequences and the spread across draws."),
    fixed_projection: bool = typer.Option(False, "--fixed-projection", help="One R per layer and k for the whole run instead (the old behaviour: its Pr describes that one draw)."),
    n: int = typer.Option(512, "--n", "--length", help="Sequence length n."),
    d: int = typer.Option(64, "--d", help="Head dimension of --synthetic q, k, v."),
    heads: int = typer.Option(1, "--heads", help="Heads per --synthetic sample."),
    samples: int = typer.Option(100, "--samples", help="Sequences (or synthetic samples)."),
    mode: ModeOption = Mode.PACK,
    batch_size: BatchSize = 8,
    seed: Seed = 0,
    split: Split = None,
    text_column: TextColumn = None,
    device: DeviceOption = Device.AUTO,
    dtype: DTypeOption = DType.FLOAT32,
    gguf_file: GGUFFile = None,
    out: Out = None,
    overwrite: Overwrite = False,
    resume: Resume = False,
    plot: bool = typer.Option(False, "--plot", help="Draw success probability vs k (bound dashed) and error vs k into the run directory's figures/."),
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Theorems 1 and 2 (JL projections) against reality: success probability vs bound, errors vs k."""
    from .api import theorems as run_theorems
    from .report.console import print_theorems, progress_bar
    from .runs import TheoremRun

    run = _saved(ctx, model, TheoremRun, "is not a theorems run; re-plot analyze runs with 'spectra plot'")
    if run is None:
        with progress_bar("sequences") as progress:
            run = run_theorems(
                model, data, budgets=numbers(k, "--k") if k is not None else None, eps=numbers(eps, "--eps", float),
                synthetic=synthetic,
                draws=draws, fixed_projection=fixed_projection, d=d,
                heads=heads, length=n, samples=samples, mode=mode, batch_size=batch_size, seed=seed, split=split,
                text_column=text_column, device=device, dtype=dtype, gguf_file=gguf_file, out=out, overwrite=overwrite,
                resume=resume, trust_remote_code=trust_remote_code, progress=progress, notify=_notify,
            )
    _report(run, print_theorems, plot, "plot_theorems")


@app.command(cls=FlaglessCommand)
def scaling(
    model: str = typer.Argument(..., help="Hub id or model directory (as for analyze)."),
    data: Data = "imdb",
    lengths: str = typer.Option("64,128,256,512", "--lengths", help="Sequence lengths n, comma-separated (at least two); one analyze run each."),
    samples: int = typer.Option(100, "--samples", help="Sequences per length."),
    bootstrap: int = typer.Option(200, "--bootstrap", help="Bootstrap replicates over sequences for the interval of the growth exponent (0: none)."),
    spectrum: Spectrum = typer.Option(Spectrum.EXACT, "--spectrum", help="exact (float64, within 1e-6 of scipy) or fast (float32 route, ~1e-4: long n)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Spectra of these layers only, e.g. 0,14,29 (long n: each spectrum costs O(n³))."),
    heads: Optional[str] = typer.Option(None, "--heads", help="Spectra of these heads only, e.g. 0-3."),
    approx_target: Optional[float] = typer.Option(None, "--approx-target", help="Also run approx at each n and report the smallest k whose per-layer mean head-output error reaches this."),
    methods: str = typer.Option("svd", "--methods", help="Methods for --approx-target, comma-separated (e.g. svd,linformer-pca(kv))."),
    k: Optional[str] = typer.Option(None, "--k", help="Budgets tried with --approx-target (default: powers of two up to n/2)."),
    fit_samples: int = typer.Option(0, "--fit-samples", help="Calibration sequences for fitted methods with --approx-target."),
    mode: ModeOption = Mode.PACK,
    batch_size: BatchSize = 8,
    seed: Seed = 0,
    split: Split = None,
    text_column: TextColumn = None,
    device: DeviceOption = Device.AUTO,
    dtype: DTypeOption = DType.FLOAT32,
    gguf_file: GGUFFile = None,
    out: Out = None,
    overwrite: Overwrite = False,
    resume: Resume = False,
    plot: bool = typer.Option(False, "--plot", help="Draw rank vs n (log-log, a line per layer) and c at fixed k vs n into the run directory's figures/."),
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Does the k a head needs grow with n? Analyze at several lengths and fit rank ∝ n^α per layer, with intervals."""
    from .report.console import print_scaling, progress_bar
    from .length_sweep import scaling as run_scaling

    with progress_bar("sequences") as progress:
        run = run_scaling(
            model, data, lengths=lengths, samples=samples, bootstrap=bootstrap, spectrum=spectrum, layers=layers,
            heads=heads, approx_target=approx_target, methods=methods,
            budgets=numbers(k, "--k") if k else None, fit_samples=fit_samples, mode=mode, batch_size=batch_size,
            seed=seed, split=split, text_column=text_column, device=device, dtype=dtype, gguf_file=gguf_file,
            out=out, overwrite=overwrite, resume=resume, trust_remote_code=trust_remote_code, progress=progress,
            notify=_notify,
        )
    _report(run, print_scaling, plot, "plot_scaling")


@app.command(cls=FlaglessCommand)
def figure1(
    runs: list[Path] = typer.Argument(..., help="Run directories of spectra analyze; one curve panel per model depth."),
    out: Path = typer.Option(Path("figures/figure1"), "--out", help="Figure path without suffix: writes .png (200 dpi) and .pdf (default: figures/figure1 under the current directory, as the figure draws several runs)."),
    heatmap: Optional[Path] = typer.Option(None, "--heatmap", help="Run drawn as the heatmap (default: the first Wikitext run of the shallowest model, else the first run)."),
    at: Optional[int] = typer.Option(None, "--at", help="1-based singular-value index of the heatmap (default n/4: 128 for n = 512)."),
    band: float = typer.Option(0.1, "--band", help="Shade from this quantile to 1 − it across the layer×head mean curves (0: min–max)."),
) -> None:
    """The paper's Figure 1: normalized cumulative singular value per model depth and dataset, and the heatmap at n/4."""
    from .report.console import out as stdout
    from .report.plots import figure1 as draw_figure1

    paths = draw_figure1(runs, out, heatmap=heatmap, at=at, quantile=band)
    for path in paths:
        stdout.print(f"wrote {path}", soft_wrap=True)


@app.command(cls=FlaglessCommand)
def plot(
    run: Path = typer.Argument(..., help="A run directory (analyze, approx, theorems or scaling)."),
    at: Optional[int] = typer.Option(None, "--at", help="1-based singular-value index of the c heatmap (default: the run's, n/4 unless analysed with --at)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for the figures (default RUN/figures, beside the run's numbers)."),
) -> None:
    """A run's views; for analyze: per-layer curves, heatmap of c at an index, rank for 90%/99% per layer and head."""
    from .report import plots
    from .report.console import out as stdout
    from .runs import Run, load_run

    loaded = load_run(run)
    if isinstance(loaded, Run):
        paths = plots.plot_run(loaded, out, at=at).paths
    else:
        paths = getattr(plots, f"plot_{loaded.meta['kind']}")(loaded, out)
    for path in paths:
        stdout.print(f"wrote {path}", soft_wrap=True)


@app.command("plan-k", cls=FlaglessCommand)
def plan_k(
    run: Path = typer.Argument(..., help="A run directory of spectra analyze."),
    energy: float = typer.Option(0.9, "--energy", help="Share E in (0, 1] of the nuclear norm a layer's top k singular values must reach (k: its budget)."),
    multiple: int = typer.Option(8, "--multiple", help="Round every budget up to a multiple of this (capped at n)."),
    per_head: bool = typer.Option(False, "--per-head", help="Plan each head from its own mean curve; a layer gets the largest of its heads."),
    out: Optional[Path] = typer.Option(None, "--out", help="JSON plan to write (default <run>/plan-k-e<E>[-per-head].json)."),
) -> None:
    """Nonuniform projected dimension: the smallest budget per layer (or head) whose mean curve reaches E."""
    from .report.console import out as stdout, print_plan
    from .report.plan import plan_k as make_plan
    from .rundir import write_json
    from .runs import load_analyze

    loaded = load_analyze(run)
    plan = make_plan(loaded, energy, multiple=multiple, per_head=per_head)
    target = out or loaded.path / f"plan-k-e{plan.energy:g}{'-per-head' if per_head else ''}.json"
    if target.is_dir():
        raise SpectraError(f"--out {target} is a directory; give a .json file path")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json(target, plan.to_json())  # before printing: output piped into `head` must not lose the file
    print_plan(loaded, plan)
    stdout.print(f"plan written to {target}")


@app.command(cls=FlaglessCommand)
def compare(
    runs: list[Path] = typer.Argument(..., help="Run directories of spectra analyze (models, datasets or lengths)."),
    at: Optional[int] = typer.Option(None, "--at", help="1-based index for c (default: each run's, n/4, so different lengths compare at the same relative index)."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Also write the tidy table (one row per run and layer) to this CSV file."),
) -> None:
    """Headline numbers of several runs side by side: per layer c at the index and rank needed for 90%."""
    from .report.console import out as stdout, print_compare
    from .report.summaries import compare as compare_runs
    from .rundir import write_table
    from .runs import load_analyze

    if csv is not None and csv.is_dir():
        raise SpectraError(f"--csv {csv} is a directory; give a .csv file path")
    loaded = [load_analyze(path) for path in runs]
    table = compare_runs(loaded, at)
    if csv is not None:  # before printing: output piped into `head` must not lose the file
        csv.parent.mkdir(parents=True, exist_ok=True)
        write_table(csv, table)
    print_compare(loaded, table, at)
    if csv is not None:
        stdout.print(f"table written to {csv}")


def _stop(signum: int, frame: object) -> None:
    """Outside a run's batches a signal stops at once (a run's loop defers it to the next batch and checkpoints)."""
    raise Interrupted("interrupted before any sequence was processed; nothing was written")


def _quiet_stdout() -> None:
    """Output piped into a program that stopped reading (| head) is not an error: stop writing quietly."""
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:  # pragma: no cover
        pass


def main() -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, an interrupt one line and exit code
    130, never a traceback. Does not depend on how typer or click treat KeyboardInterrupt: Ctrl-C raises
    spectra's own `Interrupted`, which they pass through. Messages spell options as the command line does."""
    if os.environ.get("RANK", "0") != "0":  # under torchrun only process 0 prints results
        sys.stdout = open(os.devnull, "w")
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        app(standalone_mode=False)
    except SpectraError as error:
        print(f"error: {error.for_cli()}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as stopped:
        print(stopped.for_cli(), file=sys.stderr)
        sys.exit(130)
    except (click.exceptions.Exit, typer.Exit) as done:
        sys.exit(done.exit_code)
    except USAGE_ERRORS as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # bare `spectra`: the usage is the whole answer
            if error.format_message():  # plain formatting returns the help; rich formatting has printed it
                print(error.format_message(), file=sys.stderr)
            sys.exit(2)
        hint = f" (see 'spectra {error.ctx.info_name} --help')" if error.ctx and error.ctx.parent else " (see 'spectra --help')"
        message = error.format_message().replace("Value error, ", "")  # typer's wording for a bad choice
        print(f"error: {message}{hint}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:
        _quiet_stdout()
    except (click.Abort, typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


if __name__ == "__main__":
    main()
