"""The `spectra` command: thin typer commands over the Python API."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click
import typer

from .errors import SpectraError

try:  # typer ≥ 0.26 vendors its own copy of click
    from typer._click.exceptions import UsageError as _TyperUsageError
except ImportError:  # pragma: no cover - older typer raises click's own
    _TyperUsageError = click.UsageError
USAGE_ERRORS = (click.UsageError, _TyperUsageError)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Empirical spectral analysis of the attention of pretrained transformers (Linformer, Wang et al. 2020).",
)


@app.callback()
def _root() -> None:
    """Empirical spectral analysis of the attention of pretrained transformers (Linformer, Wang et al. 2020)."""


@app.command()
def analyze(
    model: str = typer.Argument(..., help="Hugging Face hub id (roberta-base) or a local directory saved with save_pretrained."),
    data: str = typer.Option("imdb", "--data", help="imdb, wikitext-103, wikitext-2, or a local .txt/.jsonl/.csv/.parquet file."),
    length: int = typer.Option(512, "--length", help="Sequence length n, special tokens included; at most what the model can embed."),
    samples: int = typer.Option(10000, "--samples", help="Number of sequences; fewer if the corpus yields fewer (said at the end)."),
    mode: str = typer.Option("pack", "--mode", help="pack: documents concatenated into blocks of exactly n tokens; truncate: one document per sequence, cut at n, padded."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per forward pass."),
    seed: int = typer.Option(0, "--seed", help="Seed of the document shuffle."),
    split: Optional[str] = typer.Option(None, "--split", help="Split of a named dataset (default: test)."),
    text_column: Optional[str] = typer.Option(None, "--text-column", help="Column holding the text in .jsonl/.csv/.parquet files (default: text)."),
    at: Optional[int] = typer.Option(None, "--at", help="1-based singular-value index for c@index and the heatmap (default n/4: 128 for n = 512)."),
    device: str = typer.Option("auto", "--device", help="auto (cuda when present, else cpu), cpu, cuda or mps."),
    dtype: str = typer.Option("float32", "--dtype", help="Forward-pass dtype: float32, bfloat16 or float16; spectra are always float32 or better."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/<model>-<data>-n<length>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing run directory (only once the new run is complete)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run from its last checkpoint."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow code shipped with the model to run (off by default)."),
) -> None:
    """Singular spectra of the context mapping matrix P for every layer and head, averaged over sequences."""
    from .console import frame_table, out as stdout, progress_bar
    from .pipeline import analyze as run_analyze

    with progress_bar("sequences") as progress:
        run = run_analyze(
            model, data, length=length, samples=samples, mode=mode, batch_size=batch_size, seed=seed, split=split,
            text_column=text_column, at=at, device=device, dtype=dtype, out=out, overwrite=overwrite, resume=resume,
            trust_remote_code=trust_remote_code, progress=progress, notify=lambda line: print(line, file=sys.stderr),
        )
    per_layer = run.metrics.groupby("layer")[["c_at_mean", "rank90_mean"]].mean().reset_index()
    per_layer.columns = ["layer", f"c@{run.at}", "rank for 90%"]
    stdout.print(f"{run.label}: n = {run.n}, {run.meta['samples']} sequences, mean over {run.heads} heads per layer")
    stdout.print(frame_table(per_layer))
    stdout.print(f"results written to {run.path}")


def main() -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback."""
    try:
        app(standalone_mode=False)
    except SpectraError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except (click.exceptions.Exit, typer.Exit) as done:
        sys.exit(done.exit_code)
    except USAGE_ERRORS as error:
        hint = f" (see 'spectra {error.ctx.info_name} --help')" if error.ctx and error.ctx.parent else " (see 'spectra --help')"
        print(f"error: {error.format_message()}{hint}", file=sys.stderr)
        sys.exit(2)
    except (click.Abort, typer.Abort, KeyboardInterrupt):
        print("interrupted; continue later with --resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
