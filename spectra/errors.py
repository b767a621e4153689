"""spectra's exceptions: `SpectraError` (bad input; the CLI turns it into one line and exit code 2), `Interrupted`
(exit code 130) and `InternalError` (a bug: never turned into a one-line message)."""


class SpectraError(Exception):
    """Bad input or an unusable environment: the message says what is wrong and how to fix it."""


class Interrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM); the message says how far it got and how to continue."""


class InternalError(RuntimeError):
    """A bug in spectra, not bad input: an invariant the code relies on was broken (e.g. a captured record
    reached a probe without its sequences' global indices). It is never caught into a one-line message."""
