"""The command line's shared vocabulary: the options several commands take (declared once, read by typer for
--help), the command classes that show them, and the usage errors typer and click raise.

Imports only typer and `spectra.config` (choice sets, no torch), so `spectra --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from .config import Device, DType, Mode

try:  # typer ≥ 0.26 vendors its own copy of click
    from typer._click.exceptions import UsageError as _TyperUsageError
except ImportError:  # pragma: no cover - older typer raises click's own
    _TyperUsageError = click.UsageError
USAGE_ERRORS = (click.UsageError, _TyperUsageError)

# options shared by analyze, approx and theorems
Data = Annotated[str, typer.Option("--data", help="imdb, wikitext-103, wikitext-2, or a local .txt/.jsonl/.csv/.parquet file.")]
ModeOption = Annotated[Mode, typer.Option("--mode", help="pack: documents concatenated into blocks of exactly n tokens; truncate: one document per sequence, cut at n, padded.")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Sequences per forward pass.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed (≥ 0) of the document shuffle and of every random draw (projections, masking).")]
Split = Annotated[Optional[str], typer.Option("--split", help="Split of a named dataset (default: test).")]
TextColumn = Annotated[Optional[str], typer.Option("--text-column", help="Column holding the text in .jsonl/.csv/.parquet files (default: text).")]
DeviceOption = Annotated[Device, typer.Option("--device", help="auto: cuda when present, else cpu.")]
DTypeOption = Annotated[DType, typer.Option("--dtype", help="Forward-pass dtype; spectra and errors are always float32 or better.")]
Out = Annotated[Optional[Path], typer.Option("--out", help="Run directory (default: under runs/, named after model, data and n).")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing run directory (only once the new run is complete).")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run from its last checkpoint.")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow code shipped with the model to run (off by default).")]
GGUFFile = Annotated[Optional[str], typer.Option("--gguf-file", help="A GGUF file inside the MODEL directory (or give the .gguf file as MODEL); needs the gguf package.")]


class Flagless:
    """Commands whose flags show no value type in --help: a flag takes no value, so typer's "<bool>" beside it
    would read as one to type."""

    def get_params(self, ctx: click.Context) -> list:
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class FlaglessCommand(Flagless, typer.core.TyperCommand):
    """A command whose --help shows no type beside its flags."""


class FlaglessGroup(Flagless, typer.core.TyperGroup):
    """The command group, likewise (its --version and --help)."""
