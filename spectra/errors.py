"""The one exception type the CLI turns into a one-line message and exit code 2."""


class SpectraError(Exception):
    """Bad input or an unusable environment: the message says what is wrong and how to fix it."""


class Interrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM); the message says how far it got and how to continue."""
