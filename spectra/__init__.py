"""spectra: empirical spectral analysis of the attention of pretrained transformers.

Every analysis is a registered kind (`spectra.kinds`) run by one loop (`spectra.loop`): `analyze` (singular
spectra of P), `approx` (how well cheap attentions stand in at a budget), `theorems` (the Linformer paper's JL
theorems against reality), `scaling` (how the needed rank grows with n), and whatever else is registered; each
is a keyword function here (`spectra.analyze(model, data, …)`, built by `spectra.api`), and so is every report page
(`spectra.leaderboard(runs, out=…)`, `spectra.pages`). Runs load back with
`load_run` (each analysis's run object, printer and figures are its read side, `spectra.report.<kind>`). Names
are imported on first use, so `import spectra` (and `spectra --help`) stays fast.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("spectra-attention")
except PackageNotFoundError:  # pragma: no cover - running from a source tree that was never installed
    __version__ = "0+unknown"

#: public name → module that defines it (`module:attribute` where the name differs), besides what the registered
#: analyses export (each analysis is a function of `spectra.api`, and its finished run's class, `run_type`, comes
#: from its read side `spectra.report.<name>`); `tasks` and `artifacts` are the functions of the commands of those names
_EXPORTS = {"SpectraError": "errors", "load_run": "kinds", "tasks": "api", "artifacts": "api"}


def _exports() -> dict[str, str]:
    """Every public name → the module that defines it: the fixed ones and each registered analysis's run class."""
    kinds = importlib.import_module(".kinds", __name__)
    return _EXPORTS | {kind.run_type: f"report.{kind.name}" for kind in kinds.REGISTRY.values()}


def __getattr__(name: str):
    exports = _exports()
    if name in exports:
        module, _, attribute = exports[name].partition(":")
        return getattr(importlib.import_module(f".{module}", __name__), attribute or name)
    kinds = importlib.import_module(".kinds", __name__)
    api = importlib.import_module(".api", __name__)
    if name in kinds.REGISTRY or name in api.pages():
        return getattr(api, name)
    raise AttributeError(f"module 'spectra' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({"__version__", *_exports(), *importlib.import_module(".kinds", __name__).REGISTRY,
                   *importlib.import_module(".api", __name__).pages()})
