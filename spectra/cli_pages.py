"""The report pages' commands: `spectra <page> RUN… --out DIR` for every registered page (`spectra.pages`), its
options read from the page's option dataclass as an analysis's are (`spectra.options`).

Imports only typer and torch-free modules (a page imports what it computes with when it runs), so `spectra --help`
stays fast.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from .cli_options import FlaglessCommand, option_parameter
from .options import declared
from .pages.base import Page


def parameters(page: Page) -> list[inspect.Parameter]:
    """RUNS, --out DIR, then the page's own options."""
    runs = typer.Argument(help=page.runs_help, metavar="RUN")
    out = typer.Option(..., "--out", help=f"The folder to write the page into: {page.name}.md (its values and "
                       f"claims), {page.name}.png (its picture) and {page.name}.csv (its numbers), replacing those "
                       "of an earlier write; made if missing.")
    found = [inspect.Parameter("runs", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[list[Path], runs]),
             inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[Path, out])]
    return found + [option_parameter(option, option.default) for option in declared(page.options) if option.cli]


def command(page: Page) -> Callable[..., None]:
    """The command of `page`: writes it (`pages.written.write`) and says where."""

    def write(runs: list[Path], out: Path, **options: Any) -> None:
        from .pages.written import write as write_page
        from .report.console import out as stdout

        for path in write_page(page, runs, out, **options).paths:
            stdout.print(f"wrote {path}", soft_wrap=True)

    write.__signature__ = inspect.Signature(parameters(page))  # type: ignore[attr-defined]
    write.__doc__ = page.summary
    write.__name__ = page.function
    return write


def add_pages(app: typer.Typer, pages: Mapping[str, Page]) -> None:
    """One command per registered page, in the registry's order."""
    for name, page in pages.items():
        app.command(name, cls=FlaglessCommand, help=page.summary)(command(page))
