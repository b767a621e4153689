"""What an analysis is: a registered kind that declares its options, runs, loads, prints and plots.

An `Analysis` subclass is the one place an analysis lives. It declares

- `options`: a frozen dataclass of its options, each made with `spectra.options.option` (flag, help, identity);
- `run_fields`, `defaults`: which run-configuration options it takes and its own defaults for them;
- `check(config, options, shape)`: the checks that need the model's shape, run before the model loads (from its
  config file, `checkpoints.Shape`) and again once it has loaded (for hub ids, whose files are not at hand);
- `job(config, options, reporter, found)`: the probes it runs over the one loop (`spectra.loop`), or `run(...)`
  for an analysis made of other runs (`scaling`);
- `load(path, meta)`: its finished run read back; `outputs`: the tables it writes and their first columns;
- `show(run)`, `plot(run, out)`: what it prints and draws.

`register` adds an instance to `REGISTRY`; the command line and the Python API build a command and a keyword
function for every registered analysis from these declarations, and `load_run` dispatches on run.json's kind
through the registry. Nothing here imports torch: the probes are imported inside `job`.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, ClassVar

from .. import checkpoints
from ..config import RunConfig
from ..errors import SpectraError, spell
from ..registry import Registry
from ..reporter import Reporter

#: analysis name → analysis, in registration order (the order of `spectra --help`)
REGISTRY: Registry[Analysis] = Registry("analysis")
#: every run-configuration option, in declaration order
RUN_FIELDS = tuple(field.name for field in fields(RunConfig))


class Analysis:
    """A registered kind of run (see the module docstring); subclasses override what they need."""

    name: ClassVar[str]
    #: one line for --help
    summary: ClassVar[str]
    options: ClassVar[type]
    #: the run-configuration options this analysis takes (the command line shows those marked for it)
    run_fields: ClassVar[tuple[str, ...]] = RUN_FIELDS
    #: this analysis's defaults for run-configuration options (e.g. fewer samples than analyze's 10000)
    defaults: ClassVar[dict[str, Any]] = {}
    #: whether MODEL must be given (theorems on synthetic q, k, v needs none)
    needs_model: ClassVar[bool] = True
    model_help: ClassVar[str] = ("Hugging Face hub id (roberta-base), a local directory saved with save_pretrained "
                                 "or a .gguf file; or a finished run directory, to print it again (and --plot it).")
    #: table file → its leading columns, as written (tests check every run writes them)
    outputs: ClassVar[dict[str, tuple[str, ...]]] = {}

    def check(self, config: RunConfig, options: Any, shape: checkpoints.Shape) -> None:
        """Refuse what the model's shape rules out (None fields: not known yet). Runs before and after loading."""
        if shape.positions is not None and config.length > shape.positions:
            raise SpectraError(f"{spell(f'--length {config.length}', f'length={config.length}')} exceeds what "
                               f"{shape.name} can embed ({shape.positions} tokens)")

    def job(self, config: RunConfig, options: Any, reporter: Reporter, found: checkpoints.Source):
        """The `loop.Job` this analysis runs."""
        raise NotImplementedError(f"{self.name} runs no single job; it overrides run()")

    def run(self, config: RunConfig, options: Any, reporter: Reporter) -> Path:
        """Check what can be checked without loading anything, run, and return the run directory."""
        found = checkpoints.inspect(config.model, config.gguf_file)
        self.check(config, options, found.shape())
        from ..loop import execute  # torch: only once the inputs are known to be good

        return execute(self.job(config, options, reporter, found), reporter)

    def load(self, path: Path, meta: dict[str, Any]):
        raise NotImplementedError

    def show(self, run) -> None:
        """Print the run's tables to the terminal."""

    def plot(self, run, out: str | Path | None = None) -> list[Path]:
        """Draw the run's figures (PNG and PDF) into `out` (default: the run directory's figures/)."""
        return []


def register(analysis: Analysis) -> Analysis:
    """Add `analysis` to the registry under its name (once)."""
    return REGISTRY.add(analysis.name, analysis)


def read_meta(path: Path) -> dict[str, Any]:
    """A finished run's run.json; a missing or unreadable one is one line saying what the directory is."""
    meta_path = path / "run.json"
    if not meta_path.is_file():
        hint = " (an interrupted run: finish it with --resume)" if path.name.endswith(".partial") else ""
        raise SpectraError(f"{path} is not a spectra run directory: it has no run.json{hint}")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as error:
        raise SpectraError(f"{path}/run.json is not readable: {error}") from None
    return upgraded(meta)


def upgraded(meta: dict[str, Any]) -> dict[str, Any]:
    """run.json as this version writes it. Runs with a calibration written before `samples` meant the evaluated
    sequences (as --samples does) counted every sequence read under `samples`: that count becomes `sequences`."""
    if "evaluation" in meta and "sequences" not in meta and isinstance(meta.get("samples"), int):
        first = int(meta["evaluation"][0])
        meta = {**meta, "sequences": meta["samples"], "samples": max(0, meta["samples"] - first)}
    return meta


def load_run(path: str | Path, kind: str | None = None):
    """A finished run directory read back as its analysis's run object; `kind` (e.g. "analyze") refuses any
    other kind in one line."""
    path = Path(path)
    meta = read_meta(path)
    found = meta.get("kind")
    if found not in REGISTRY:
        raise SpectraError(f"{path} holds a '{found}' run, which this version of spectra cannot read")
    if kind is not None and found != kind:
        raise SpectraError(f"{path} holds a run of 'spectra {found}'; this needs a run of 'spectra {kind}'")
    try:
        return REGISTRY[found].load(path, meta)
    except (OSError, ValueError, KeyError) as error:
        raise SpectraError(f"{path} is not a readable spectra run: {error}") from None
