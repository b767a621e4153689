"""Deferred imports for the command line's start-up: `install("torch")` makes `import torch` return a module that
loads on first use.

Importing torch costs seconds. The command line reads every analysis's declarations and the method registry to
build its commands, their --help and its input checks, and the modules it reads may `import torch` at the top
(that is where the code that computes lives) without touching it until a run starts. With the module installed
lazily (the standard library's `importlib.util.LazyLoader`), `spectra --help` and a one-line refusal of bad input
never pay for torch. Only the command line installs it; `import spectra` in a user's program imports as usual.
"""

from __future__ import annotations

import importlib.util
import sys


def install(name: str) -> None:
    """Make `import name` lazy for the rest of the process, unless it is imported already (or not installed)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)


def loaded(name: str) -> bool:
    """Whether a module installed lazily has really been loaded (its first attribute was read)."""
    module = sys.modules.get(name)
    return module is not None and type(module).__name__ != "_LazyModule"
