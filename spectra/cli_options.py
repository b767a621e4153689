"""The command line built from declarations: one command per registered analysis, its options read from the
run configuration's and the analysis's option dataclasses (`spectra.options`); the command classes that show
them; the usage errors typer and click raise.

Imports only typer and torch-free modules, so `spectra --help` stays fast.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer

from . import registry
from .config import RunConfig
from .errors import SpectraError
from .kinds import REGISTRY, Analysis
from .options import Declared, declared

try:  # typer ≥ 0.26 vendors its own copy of click
    from typer._click.exceptions import UsageError as _TyperUsageError
except ImportError:  # pragma: no cover - older typer raises click's own
    _TyperUsageError = click.UsageError
USAGE_ERRORS = (click.UsageError, _TyperUsageError)
#: the run option every command that loads a model takes; `spectra artifacts`, which builds no RunConfig, reads it here
MODEL_CACHE = next(option for option in declared(RunConfig) if option.name == "model_cache")

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
    """A command whose --help shows no type beside its flags, and after its options the sections its analysis
    lists (`Analysis.listings`: the presses of `spectra cache`), each a column of names and their one-line
    descriptions, wrapped to the terminal like the options."""

    #: the analysis the command runs (`command_class`)
    analysis: Analysis | None = None

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, rows in (self.analysis.listings() if self.analysis is not None else {}).items():
            with formatter.section(title):
                formatter.write_dl(rows)
        super().format_epilog(ctx, formatter)


def command_class(analysis: Analysis) -> type[FlaglessCommand]:
    """The command class of `analysis`'s command: `FlaglessCommand` showing its listings."""
    return type(f"{type(analysis).__name__}Command", (FlaglessCommand,), {"analysis": analysis})


class FlaglessGroup(Flagless, typer.core.TyperGroup):
    """The command group, likewise (its --version and --help); its command list shows each summary whole, wrapped
    (click would cut it at the first line's width with "...")."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, command.get_short_help_str(limit=10_000)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def cli_type(annotation: Any) -> Any:
    """The type typer parses an option as: choice sets and numbers as they are; lists (tuples), paths and plans as
    text, which the option's dataclass reads (comma-separated lists: '32,64')."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        optional, annotation = len(inner) < len(typing.get_args(annotation)), inner[0] if len(inner) == 1 else Any
    if annotation is Any or typing.get_origin(annotation) is tuple:
        annotation, optional = str, True
    return Optional[annotation] if optional else annotation


def cli_default(value: Any) -> Any:
    """A declared default as the command line shows it: a tuple as '32,64'."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else value


def option_parameter(option: Declared, default: Any, help_text: str | None = None) -> inspect.Parameter:
    help_text = help_text or option.help
    help_text = help_text.replace("{methods}", registry.method_listing()) if "{methods}" in help_text else help_text
    listed = isinstance(default, tuple)
    if listed and default:  # spaces after the commas, so that --help wraps a long list between values, never inside one
        help_text += f"  [default: {', '.join(map(str, default))}]"  # (an empty list shows none: not "[default: ]")
    info = typer.Option(*option.flags, help=help_text, metavar=option.metavar, show_default=not listed)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=cli_default(default),
                             annotation=Annotated[cli_type(option.annotation), info])


def parameters(analysis: Analysis) -> list[inspect.Parameter]:
    """MODEL, then the run configuration's options the analysis takes, its own options and --plot."""
    model = typer.Argument(help=analysis.model_help, metavar="MODEL")
    found = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
             inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               default=inspect.Parameter.empty if analysis.needs_model else None,
                               annotation=Annotated[str | None if not analysis.needs_model else str, model])]
    for cls in (RunConfig, analysis.options):
        for option in declared(cls):
            if option.cli and (cls is not RunConfig or option.name in analysis.run_fields):
                found.append(option_parameter(option, analysis.defaults.get(option.name, option.default),
                                        analysis.run_help.get(option.name) if cls is RunConfig else None))
    plot = typer.Option("--plot", help="Draw the run's figures into the run directory's figures/.")
    found.append(inspect.Parameter("plot", inspect.Parameter.KEYWORD_ONLY, default=False,
                                   annotation=Annotated[bool, plot]))
    if analysis.detail:
        found.append(inspect.Parameter("all", inspect.Parameter.KEYWORD_ONLY, default=False,
                                       annotation=Annotated[bool, typer.Option("--all", help=analysis.detail)]))
    return found


#: what a finished run given as MODEL takes: how it is shown, nothing that would change it
VIEW_OPTIONS = ("plot", "all")


def saved_run(ctx: typer.Context, model: str | None, analysis: Analysis):
    """The finished run at `model` when it is a run directory of this analysis (else None); another kind is an
    error, and so is any option given with it that a saved run cannot honour (only how it is shown applies: --plot,
    and --all where the kind has it)."""
    from .kinds import load_run, read_meta

    if model is None or not Path(model, "run.json").is_file():
        return None
    kind = read_meta(Path(model)).get("kind")
    if kind != analysis.name and kind not in analysis.hands_to:
        raise SpectraError(f"{model} is a run of 'spectra {kind}', not of 'spectra {analysis.name}'; print or plot "
                           f"it with 'spectra {kind} {model}' or 'spectra plot {model}'")
    given = [f"--{name.replace('_', '-')}" for name in ctx.params
             if name not in ("model", *VIEW_OPTIONS) and ctx.get_parameter_source(name).name == "COMMANDLINE"]
    if given:
        views = " and ".join(f"--{name}" for name in VIEW_OPTIONS if name in ctx.params)
        raise SpectraError(f"{model} is a saved run: {', '.join(given)} cannot change it (only {views} "
                           f"{'applies' if ' and ' not in views else 'apply'}); to analyse again, give the model and "
                           "another --out")
    return load_run(model, kind)


def command(analysis: Analysis, notify: Callable[[str], None]) -> Callable[..., None]:
    """The command of `analysis`: runs it (or reads a saved run given as MODEL), prints it, plots it if asked."""

    def run(ctx: typer.Context, model: str | None, plot: bool, **values: Any) -> None:
        from .api import run as run_analysis
        from .report.console import out, progress_bar

        every = values.pop("all", False)
        finished = saved_run(ctx, model, analysis)
        if finished is None:
            with progress_bar(analysis.progress_unit(values.get("data"))) as progress:
                finished = run_analysis(analysis, {"model": model, **values}, progress, notify)
        shown = REGISTRY[finished.meta["kind"]]  # the analysis that wrote it: this one or one it hands data to
        shown.show(finished, every=True) if every else shown.show(finished)  # --all: a kind with `detail`
        if plot:
            for path in shown.plot(finished):
                out.print(f"wrote {path}", soft_wrap=True)
        out.print(f"results in {finished.path}")

    run.__signature__ = inspect.Signature(parameters(analysis))  # type: ignore[attr-defined]
    run.__doc__ = analysis.summary
    run.__name__ = analysis.name
    return run


def notify_stderr(line: str) -> None:
    """The command line's notices go to stderr, so a redirected stdout holds the results only."""
    print(line, file=sys.stderr)


def add_commands(app: typer.Typer, analyses: dict[str, Analysis]) -> None:
    """One command per registered analysis, in registration order."""
    for name, analysis in analyses.items():
        app.command(name, cls=command_class(analysis), help=analysis.summary)(command(analysis, notify_stderr))
