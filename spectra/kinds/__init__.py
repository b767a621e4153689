"""The analyses: one module each, registered below — the command line and the Python API are built from them.

Adding an analysis is its module here (an `Analysis` subclass declaring its options and probes, registered), its
read side spectra/report/<name>.py (run object, load, show, plot), their tests, and one line below: the import that
registers it. See ARCHITECTURE.md.
"""

# the registry: one line per analysis, in the order `spectra --help` lists them
from . import (
    analyze,  # noqa: F401
    approx,  # noqa: F401
    cache,  # noqa: F401
    evaluate,  # noqa: F401
    heads,  # noqa: F401
    scaling,  # noqa: F401
    theorems,  # noqa: F401
)
from .base import REGISTRY, Analysis, load_run, read_meta, register

__all__ = ["REGISTRY", "Analysis", "load_run", "read_meta", "register"]
