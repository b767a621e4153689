"""Terminal output shared by the CLI and the Python API: the progress bar and the result tables of each run kind.

Results go to stdout (`out`), the progress bar to stderr (`console`), so a redirected stdout holds tables only.
The numbers printed come from `summaries` and `plan`, the same ones the figures draw.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator

import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from ..reporter import plural  # noqa: F401 (the per-kind printers take it from here)


class _Console(Console):
    """A rich console for which a reader that stopped reading (`| head`) ends the output, not the program with
    exit code 1 (rich's own reaction): the CLI treats the BrokenPipeError as a quiet, successful end."""

    def on_broken_pipe(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, (self.file or sys.stdout).fileno())
        raise BrokenPipeError


console = _Console(stderr=True)
out = _Console()


@contextlib.contextmanager
def progress_bar(unit: str) -> Iterator[Callable[[int, int], None]]:
    """A progress(done, total) callback drawing the `unit`s (sequences, examples) done, their rate — per second, or
    seconds each when one takes longer than a second (a long task example: "41.3 s/example") — and the ETA.

    The bar appears at the first call (so an input error before any work prints only its message)
    and is erased if the block ends with an error.
    """
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
    )
    task = bar.add_task(unit, total=None, rate="–")
    one = unit[:-1] if unit.endswith("s") else unit
    first: list[float] = []

    def update(done: int, total: int) -> None:
        now = bar.get_time()
        if not first:
            first.extend([now, done, done])
            bar.start()
        if done < first[2]:  # a new run on the same bar (spectra scaling: one per length): rate from here
            first[:2] = [now, done]
            bar.reset(task, total=total, rate="–")
        first[2] = done
        rate = (done - first[1]) / (now - first[0]) if now > first[0] and done > first[1] else None
        shown = "–" if not rate else f"{rate:.2f} {'seq' if one == 'sequence' else one}/s" if rate >= 1 else \
            f"{1 / rate:.1f} s/{one}"
        bar.update(task, completed=done, total=total, rate=shown)

    try:
        yield update
    except BaseException:
        bar.live.transient = True
        raise
    finally:
        if first:
            bar.stop()


# ---------------------------------------------------------------- tables


def column_header(label: str) -> str:
    """A column header: a method's registered short header (linformer(headwise) → lin / (head)), else the
    label with a parenthesis on a second line (svd (floor), a column name without one stays as it is)."""
    from ..methods import REGISTRY  # imports torch: only when a table is printed

    return REGISTRY[label].short if label in REGISTRY else label.replace("(", "\n(")


def frame_table(frame: pd.DataFrame, digits: int | dict[str, int] = 3, missing: str = "") -> Table:
    """A rich table of a DataFrame: floats rounded, NaN shown as `missing`.

    `digits`: decimals for every float column, or a map from column-name substrings to decimals
    (default 3); -1 prints a percentage.
    """
    def cell(column: str, value) -> str:
        if not isinstance(value, float):
            return str(value)
        if math.isnan(value):
            return missing
        places = digits if isinstance(digits, int) else next((d for key, d in digits.items() if key in column), 3)
        return f"{value:.1%}" if places < 0 else f"{value:.{places}f}"

    table = Table()
    for column in frame.columns:
        table.add_column(column_header(str(column)), justify="right")
    for row in frame.itertuples(index=False):
        table.add_row(*(cell(str(column), value) for column, value in zip(frame.columns, row)))
    return table


#: columns that name a row rather than measure it: a table folded to the terminal's width repeats them in every part
ROW_KEYS = ("task", "layer", "head", "kv_head", "method", "label", "budget", "k", "press", "ratio", "n", "run", "tensor",
            "stage", "metric", "scope")


def row_keys(frame: pd.DataFrame) -> list:
    """The leading columns of `frame` that name its rows (`ROW_KEYS`), or its first column when none does."""
    keys = []
    for column in frame.columns:
        if str(column) not in ROW_KEYS:
            break
        keys.append(column)
    return keys or list(frame.columns[:1])


def _natural(table: Table) -> int:
    return out.measure(table, options=out.options.update(width=10_000)).maximum


def fold(frame: pd.DataFrame, width: int, digits: int | dict[str, int] = 3, missing: str = "") -> list[pd.DataFrame]:
    """`frame` cut into parts by columns, each as wide as `width` at most when printed, each part repeating the
    columns that name a row (`row_keys`), the others in their order; one part when the whole table fits. A part
    that holds one measured column and is still too wide stays whole (the terminal wraps it)."""
    keys = row_keys(frame)
    parts: list[list] = [[]]
    for column in (column for column in frame.columns if column not in keys):
        trial = parts[-1] + [column]
        if parts[-1] and _natural(frame_table(frame[keys + trial], digits, missing)) > width:
            parts.append([column])
        else:
            parts[-1] = trial
    return [frame[keys + part] for part in parts]


def print_frame(frame: pd.DataFrame, title: str | None = None, digits: int | dict[str, int] = 3,
                missing: str = "") -> None:
    """Print a DataFrame as tables that fit the terminal: a table wider than it is folded into parts by columns,
    each repeating the columns that name a row (the run's CSV keeps every column side by side). The title wraps
    between words. Never does rich elide cells: a part still too wide prints at its natural width."""
    if title:
        out.print(title)
    for part in fold(frame, out.width, digits, missing):
        table = frame_table(part, digits, missing)
        natural = _natural(table)
        if natural <= out.width:
            out.print(table)
        else:
            _Console(width=natural, file=out.file, color_system=out.color_system).print(table)
