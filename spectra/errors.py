"""spectra's exceptions: `SpectraError` (bad input) and `Interrupted`, which the front ends turn into one line
(exit code 2 and 130), and `InternalError` (a bug: never turned into a one-line message).

A message often names an option, which the command line and Python spell differently (`--fit-samples 64`,
`fit_samples=64`). `spell(cli, api)` marks such a name inside a message; `str(error)` (what a Python user
sees) spells the API's, `error.for_cli()` (what `spectra` prints) the command line's, so neither audience reads
the other's spelling.
"""

from __future__ import annotations

import re

#: an option inside a message: START cli SPLIT api END (control characters no path or option contains)
_START, _SPLIT, _END = "\x02", "\x1f", "\x03"
_MARKED = re.compile(f"{_START}([^{_SPLIT}{_END}]*){_SPLIT}([^{_END}]*){_END}")


def spell(cli: str, api: str | None = None) -> str:
    """`cli` as the command line spells an option, `api` as Python does (default: the keyword the option's name
    becomes, --fit-samples → fit_samples), for a message of a `SpectraError` or `Interrupted`. An option already
    marked is returned as it is."""
    if _START in cli:
        return cli
    if api is None:
        api = cli.split()[0].lstrip("-").replace("-", "_")
    return f"{_START}{cli}{_SPLIT}{api}{_END}"


def render(message: str, front: str = "api") -> str:
    """`message` with every marked option spelled for `front`: "cli" or "api"."""
    group = 1 if front == "cli" else 2
    return _MARKED.sub(lambda found: found.group(group), message)


class _Spelled(Exception):
    """An exception whose message may hold options marked with `spell`."""

    def __str__(self) -> str:
        return render(super().__str__(), "api")

    def for_cli(self) -> str:
        """The message as the command line prints it."""
        return render(super().__str__(), "cli")

    @property
    def marked(self) -> str:
        """The message with its marks, for a message that embeds it."""
        return super().__str__()


class SpectraError(_Spelled):
    """Bad input or an unusable environment: the message says what is wrong and how to fix it."""


class Interrupted(_Spelled):
    """The run was stopped (Ctrl-C, SIGTERM); the message says how far it got and how to continue."""


class InternalError(RuntimeError):
    """A bug in spectra, not bad input: an invariant the code relies on was broken (e.g. a captured record
    reached a probe without its sequences' global indices). It is never caught into a one-line message."""
