"""The analyses: one module each, registered below — the command line and the Python API are built from them.

Adding an analysis is its module here (an `Analysis` subclass, registered), its test under tests/kinds/, its
figures under spectra/report/plots/ and one line below: the import that registers it. See ARCHITECTURE.md.
"""

from .base import REGISTRY, Analysis, load_run, read_meta, register

# the registry: one line per analysis, in the order `spectra --help` lists them
from . import analyze  # noqa: E402, F401, I001
from . import approx  # noqa: E402, F401
from . import theorems  # noqa: E402, F401
from . import scaling  # noqa: E402, F401

__all__ = ["REGISTRY", "Analysis", "load_run", "read_meta", "register"]
