"""How a run talks while it runs: one object for progress, notices and warnings, passed down from the front end.

The command line draws a progress bar and prints notices on stderr; the Python API prints them (or stays quiet);
the processes of a distributed run other than the first say nothing. Everything below the front ends talks
through the `Reporter` it was given, never through print.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

#: progress(done, total) after every batch; total is the requested number of sequences
Progress = Callable[[int, int], None]


def plural(count: int, noun: str) -> str:
    """'1 sequence', '2 sequences': a count in a notice or a table's title."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _silent(line: str) -> None:
    pass


@dataclass(frozen=True)
class Reporter:
    """`progress(done, total)` (None: no progress), `notify(line)` for one-line notices."""

    progress: Progress | None = None
    notify: Callable[[str], None] = print

    def warn(self, line: str) -> None:
        """A notice that something went other than asked (the run goes on)."""
        self.notify(f"warning: {line}")

    def advance(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    def quiet(self) -> Reporter:
        """A reporter that says nothing (the other processes of a distributed run)."""
        return replace(self, progress=None, notify=_silent)


QUIET = Reporter(None, _silent)
