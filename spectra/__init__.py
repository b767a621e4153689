"""spectra: empirical spectral analysis of the attention of pretrained transformers.

Three analyses share one loop (`spectra.loop`): `analyze` (singular spectra of P), `approx` (how well
cheap attentions stand in at a budget k) and `theorems` (the Linformer paper's JL theorems against
reality). Runs load back with `load_run`; figures are in `spectra.report.plots`. Names are imported
on first use, so `import spectra` (and `spectra --help`) stays fast.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("spectra-attention")
except PackageNotFoundError:  # pragma: no cover - running from a source tree that was never installed
    __version__ = "0+unknown"

#: public name → module that defines it
_EXPORTS = {
    "SpectraError": "errors",
    "analyze": "api",
    "approx": "api",
    "theorems": "api",
    "scaling": "length_sweep",
    "load_run": "runs",
    "Run": "runs",
    "ApproxRun": "runs",
    "TheoremRun": "runs",
    "ScalingRun": "runs",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'spectra' has no attribute {name!r}")
