"""The `spectra` command: one command per registered analysis (built from its declarations by
`cli_options.add_commands`), one per registered report page (`spectra leaderboard RUN… --out DIR` and the others,
`cli_pages.add_pages`), the commands that read finished runs (plot, figure1, plan-k, compare, publish), and
`tasks`, which writes task files for `spectra cache`.

Starts fast: the modules the commands are built from import neither torch, transformers nor pandas at the top,
and every command imports what it needs when it runs, so `--help` and bad input never wait for them.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click
import typer

from . import runtime
from .cli_options import MODEL_CACHE, USAGE_ERRORS, FlaglessCommand, FlaglessGroup, add_commands, notify_stderr
from .cli_pages import add_pages
from .errors import Interrupted, SpectraError
from .kinds import REGISTRY
from .pages import PAGES
from .reporter import plural
from .kv.tasks.family import generated, haystack_tasks, listing

app = typer.Typer(
    cls=FlaglessGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's plain help: a description column of ~45 characters at 80 columns, long flags and defaults whole (rich's
    # panels squeeze descriptions to ~20 characters beside a wide name column and cut names with "…")
    rich_markup_mode=None,
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


add_commands(app, REGISTRY)
add_pages(app, PAGES)


@app.command(cls=FlaglessCommand)
def figure1(
    runs: list[Path] = typer.Argument(..., help="Run directories of spectra analyze; one curve panel per model depth."),
    out: Path = typer.Option(Path("figures/figure1"), "--out", help="Figure path without suffix: writes .png (200 dpi) and .pdf (default: figures/figure1 under the current directory, as the figure draws several runs)."),
    heatmap: Path | None = typer.Option(None, "--heatmap", help="Run drawn as the heatmap (default: the first Wikitext run of the shallowest model, else the first run)."),
    at: int | None = typer.Option(None, "--at", help="1-based singular-value index of the heatmap (default n/4: 128 for n = 512)."),
    band: float = typer.Option(0.1, "--band", help="Shade from this quantile to 1 − it across the layer×head mean curves (0: min–max)."),
) -> None:
    """The paper's Figure 1: normalized cumulative singular value per model depth and dataset, and the heatmap at n/4."""
    from .kinds import load_run
    from .report.console import out as stdout
    from .report.plots import figure1 as draw_figure1
    from .rundir import check_writable

    check_writable(out)
    paths = draw_figure1([load_run(path, "analyze") for path in runs], out,
                         heatmap=None if heatmap is None else load_run(heatmap, "analyze"), at=at, quantile=band)
    for path in paths:
        stdout.print(f"wrote {path}", soft_wrap=True)


@app.command(cls=FlaglessCommand)
def plot(
    run: Path = typer.Argument(..., help="A run directory (analyze, approx, theorems or scaling)."),
    at: int | None = typer.Option(None, "--at", help="1-based singular-value index of the c heatmap (default: the run's, n/4 unless analysed with --at)."),
    out: Path | None = typer.Option(None, "--out", help="Directory for the figures (default RUN/figures, beside the run's numbers)."),
) -> None:
    """A run's views; for analyze: per-layer curves, heatmap of c at an index, rank for 90%/99% per layer and head."""
    from .kinds import load_run
    from .kinds.base import read_meta
    from .report.console import out as stdout
    from .rundir import check_writable

    check_writable(out if out is not None else run / "figures", inside=True)
    loaded = load_run(run, read_meta(run).get("kind"))  # a published folder is drawn only where it is the run
    if at is not None:  # only analyze runs have an index to draw the heatmap at
        from .report.analyze import plot_run

        paths = plot_run(load_run(run, "analyze"), out, at=at).paths
    else:
        paths = REGISTRY[loaded.meta["kind"]].plot(loaded, out)
    for path in paths:
        stdout.print(f"wrote {path}", soft_wrap=True)


@app.command("plan-k", cls=FlaglessCommand)
def plan_k(
    run: Path = typer.Argument(..., help="A run directory of spectra analyze."),
    energy: float = typer.Option(0.9, "--energy", help="Share E in (0, 1] of the nuclear norm the top k_proj singular values must reach."),
    multiple: int = typer.Option(8, "--multiple", help="Round every k_proj up to a multiple of this (capped at n)."),
    per_head: bool = typer.Option(False, "--per-head", help="Plan each head from its own mean curve; a layer gets the largest of its heads."),
    out: Path | None = typer.Option(None, "--out", help="JSON plan to write (default <run>/plan-k-e<E>[-per-head].json)."),
) -> None:
    """Nonuniform projected dimension: the smallest k_proj per layer (or head) whose mean curve reaches E."""
    from .kinds import load_run
    from .report.console import out as stdout
    from .report.analyze import print_plan
    from .report.plan import plan_k as make_plan
    from .rundir import check_writable, write_json

    if out is not None:
        check_writable(out)
    loaded = load_run(run, "analyze")
    plan = make_plan(loaded, energy, multiple=multiple, per_head=per_head)
    target = out or loaded.path / f"plan-k-e{plan.energy:g}{'-per-head' if per_head else ''}.json"
    if target.is_dir():
        raise SpectraError(f"--out {target} is a directory; give a .json file path")
    check_writable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json(target, plan.to_json())  # before printing: output piped into `head` must not lose the file
    print_plan(loaded, plan)
    stdout.print(f"plan written to {target}")


@app.command(cls=FlaglessCommand)
def compare(
    runs: list[Path] = typer.Argument(..., help="Run directories of spectra analyze (models, datasets or lengths)."),
    at: int | None = typer.Option(None, "--at", help="1-based index for c (default: each run's, n/4, so different lengths compare at the same relative index)."),
    csv: Path | None = typer.Option(None, "--csv", help="Also write the tidy table (one row per run and layer) to this CSV file."),
) -> None:
    """Headline numbers of several runs side by side: per layer c at the index and rank needed for 90%."""
    from .kinds import load_run
    from .report.console import out as stdout
    from .report.analyze import print_compare
    from .report.summaries import compare as compare_runs
    from .rundir import check_writable, write_table

    if csv is not None and csv.is_dir():
        raise SpectraError(f"--csv {csv} is a directory; give a .csv file path")
    if csv is not None:
        check_writable(csv, "--csv")
    loaded = [load_run(path, "analyze") for path in runs]
    table = compare_runs(loaded, at)
    if csv is not None:  # before printing: output piped into `head` must not lose the file
        csv.parent.mkdir(parents=True, exist_ok=True)
        write_table(csv, table)
    print_compare(loaded, table, at)
    if csv is not None:
        stdout.print(f"table written to {csv}")


@app.command(cls=FlaglessCommand)
def publish(
    runs: list[Path] = typer.Argument(..., help="Finished run directories of spectra evaluate or spectra analyze."),
    out: Path = typer.Option(..., "--out", help="Folder receiving each run's published form as OUT/<run name>/ (results/leaderboard), replacing one of that name: its run.json and its tables gzipped, small enough to commit."),
) -> None:
    """A task or analyze run's tables in a small folder to commit, each file's sha256 in its run.json; a task run's
    reads back as the run, an analyze run's as its per-head tables."""
    from .report.console import out as stdout
    from .report.published import publish as write_published

    for path in write_published(runs, out):
        size = sum(file.stat().st_size for file in path.iterdir())
        stdout.print(f"wrote {path} ({size / 1e3:.0f} kB)", soft_wrap=True)


def fitted_line(task: str, size: int, tokens: list[int]) -> str:
    """What `spectra tasks` says of one task at one length: "passkey at 1024: 1 example of 1020 tokens", a range only
    where the examples' lengths differ ("3 examples of 1010–1024 tokens")."""
    span = f"{min(tokens)}" if min(tokens) == max(tokens) else f"{min(tokens)}–{max(tokens)}"
    return f"{task} at {size}: {plural(len(tokens), 'example')} of {span} tokens"


@app.command("tasks", cls=FlaglessCommand)
def tasks_command(
    model: str = typer.Argument(..., help="A decoder: hub id, local directory, or .gguf file (only its tokenizer and config are read)."),
    tasks: str = typer.Option("all", "--tasks", help=f"Comma-separated: {listing(generated())} (or all)."),
    length: str = typer.Option(..., "--length", help="Comma-separated lengths in the model's tokens (chat template and generated tokens included, as RULER counts them), e.g. 1024,2048,4096."),
    samples: int = typer.Option(10, "--samples", help="Examples per task and length; needle depths spread evenly over them."),
    out: Path = typer.Option(..., "--out", help="The task file to write (.jsonl, kvpress's fields plus length, depth and haystack)."),
    haystack: list[str] | None = typer.Option(None, "--haystack", metavar="<str>", help=f"What the tasks RULER hides in its essays ({listing(haystack_tasks())}) read: local text files or folders of them, comma-separated (or the option repeated), or noise (RULER's noise sentence repeated); default: the licence texts Debian ships, /usr/share/common-licenses. The other tasks read RULER's noise or distractor needles, as RULER's do."),
    seed: int = typer.Option(0, "--seed", help="Seed of every draw."),
    gguf_file: str | None = typer.Option(None, "--gguf-file", help="A GGUF file inside the MODEL directory (or give the .gguf file as MODEL)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file (as a run directory is replaced)."),
) -> None:
    """Long-context task files generated offline: RULER's synthetic tasks, passkey and InfiniteBench's kv_retrieval,
    fitted to the model's tokens."""
    from .report.console import out as stdout
    from .api import tasks as make_tasks
    from .kv.tasks.command import haystack_line

    def progress(task: str, size: int, fitted: list) -> None:
        stdout.print(fitted_line(task, size, [item.tokens for item in fitted]), soft_wrap=True)

    written = make_tasks(model, tasks=tasks, lengths=length, samples=samples, out=out, haystack=haystack or None,
                         seed=seed, gguf_file=gguf_file, overwrite=overwrite, progress=progress)
    for note in written.notes:
        print(f"warning: {note}", file=sys.stderr)
    line = haystack_line(written)
    if line is not None:
        stdout.print(line, soft_wrap=True)
    stdout.print(f"wrote {written.path} ({plural(len(written.fitted), 'record')})", soft_wrap=True)


@app.command("artifacts", cls=FlaglessCommand)
def artifacts_command(
    kind: str = typer.Argument(..., help="What to fit: qfilter (Q-Filters: the queries' top singular direction per key/value head), expected_attention_stats (the queries' mean and covariance per head) or kvzap (KVzap's surrogate: per layer, the hidden states → log KVzip scores)."),
    model: str = typer.Argument(..., help="A decoder (with rotary positions for qfilter and expected_attention_stats): hub id, local directory, or .gguf file."),
    data: str = typer.Option(..., "--data", help="Local text files, comma-separated (e.g. /usr/share/common-licenses/GPL-3), cut into blocks of --length tokens."),
    out: Path = typer.Option(..., "--out", help="The directory to write: config.json and model.safetensors, the layout kvpress's loader reads (qfilter(DIR), expected_attention_stats(DIR), kvzap(DIR) in spectra cache)."),
    length: int = typer.Option(1000, "--length", help="Tokens per calibration block."),
    samples: int = typer.Option(16, "--samples", help="Calibration blocks (the first ones the files hold; fewer where they hold fewer, said in a notice)."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads (default: torch's)."),
    gguf_file: str | None = typer.Option(None, "--gguf-file", help="A GGUF file inside the MODEL directory (or give the .gguf file as MODEL)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out directory."),
    surrogate: str = typer.Option("mlp", "--surrogate", help="kvzap only: linear (ridge least squares) or mlp (Linear–GELU–Linear, kvpress's default)."),
    model_cache: bool = typer.Option(MODEL_CACHE.default, *MODEL_CACHE.flags, help=MODEL_CACHE.help),
) -> None:
    """A press's learned artifact fitted on local text, written where kvpress loads it: Q-Filters, query statistics or
    KVzap's surrogate."""
    from .report.console import out as stdout
    from .api import artifacts as make_artifact

    written = make_artifact(kind, model, data=data, out=out, length=length, samples=samples, threads=threads,
                            gguf_file=gguf_file, overwrite=overwrite, surrogate=surrogate, model_cache=model_cache,
                            notify=notify_stderr)
    stdout.print(f"wrote {written} ({kind}(DIR) in spectra cache --presses)", soft_wrap=True)


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
    runtime.prefer_passive_wait()  # before torch loads: idle OpenMP threads sleep instead of spinning (runtime.py)
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
