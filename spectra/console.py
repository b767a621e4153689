"""Terminal output shared by the CLI and the Python API: progress bars and result tables."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)
out = Console()


@contextlib.contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """A progress(done, total) callback drawing sequences done, sequences/s and the ETA.

    The bar appears at the first call (so an input error before any work prints only its message)
    and is erased if the block ends with an error.
    """
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} seq/s"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
    )
    task = bar.add_task(description, total=None, rate="–")
    first: list[float] = []

    def update(done: int, total: int) -> None:
        now = bar.get_time()
        if not first:
            first.extend([now, done])
            bar.start()
        rate = (done - first[1]) / (now - first[0]) if now > first[0] and done > first[1] else None
        bar.update(task, completed=done, total=total, rate=f"{rate:.2f}" if rate else "–")

    try:
        yield update
    except BaseException:
        bar.live.transient = True
        raise
    finally:
        if first:
            bar.stop()


def frame_table(frame: pd.DataFrame, title: str | None = None, digits: int = 3) -> Table:
    """A rich table of a DataFrame, floats rounded to `digits`."""
    table = Table(title=title, title_justify="left")
    for column in frame.columns:
        table.add_column(str(column), justify="right")
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{x:.{digits}f}" if isinstance(x, float) else str(x) for x in row))
    return table
