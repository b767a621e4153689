"""What an analysis is: a registered kind that declares what it runs; the base wires it into the one loop.

An `Analysis` subclass is the one place an analysis lives. It declares

- `options`: a frozen dataclass of its options, each made with `spectra.options.option` (flag, help, identity);
- `run_fields`, `defaults`: which run-configuration options it takes and its own defaults for them;
- `check(config, options, shape)`: the checks that need the model's shape, run before the model loads (from its
  config file, `checkpoints.Shape`) and again once it has loaded (for hub ids, whose files are not at hand);
  `check_files` and `check_loaded` for what needs the model's configuration or the loaded model itself;
- `probe(config, options, reporter, source)`: the probes it runs over the loaded model, and what it records beside
  their tables (`meta`), the source it reads (`source_options`: a language-model head, logits kept; `source` for
  another source than the corpus read through the model), the sequences it calibrates on first (`calibration`)
  and how much memory a sequence's batch takes (`work`, or `memory` for another estimate);
- `resolve` and `configured`: its options and run configuration as they stand at the run's length;
- `load(path, meta)`: its finished run read back; `outputs`: the tables it writes and their first columns;
- `show(run)`, `plot(run, out)`: what it prints and draws.

From these the base builds the loop's `loop.Job` (`job`), re-checks the shape once the model has loaded and refuses
what several kinds refuse alike (calibration across processes, calibration sequences that leave none to evaluate).
An analysis made of other runs (`scaling`) overrides `run` and reaches the analyses it runs through `REGISTRY`:
kinds never import each other; what two of them share lives here (`model_source`, `check_selection`,
`check_evaluable`).

`register` adds an instance to `REGISTRY`; the command line and the Python API build a command and a keyword
function for every registered analysis from these declarations, and `load_run` dispatches on run.json's kind
through the registry. Nothing here imports torch: the loop and the probes are imported when a run starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import fields, replace
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

from .. import checkpoints
from ..config import RunConfig
from ..errors import SpectraError, spell
from ..options import defaults, identity
from ..registry import Registry
from ..reporter import Reporter

#: analysis name → analysis, in registration order (the order of `spectra --help`)
REGISTRY: Registry[Analysis] = Registry("analysis")
#: every run-configuration option, in declaration order
RUN_FIELDS = tuple(field.name for field in fields(RunConfig))
#: the sequences a run evaluates when neither the user nor the analysis says how many
DEFAULT_SAMPLES: int = next(field.default for field in fields(RunConfig) if field.name == "samples")


class Analysis:
    """A registered kind of run (see the module docstring); subclasses override what they need."""

    name: ClassVar[str]
    #: one line for --help
    summary: ClassVar[str]
    options: ClassVar[type]
    #: the class of its finished run in its read side (`spectra/report/<name>.py`), exported as `spectra.<run_type>`
    run_type: ClassVar[str]
    #: the analyses this one hands some data to (whose runs its command therefore reads back too), by name
    hands_to: ClassVar[tuple[str, ...]] = ()
    #: the run-configuration options this analysis takes (the command line shows those marked for it)
    run_fields: ClassVar[tuple[str, ...]] = RUN_FIELDS
    #: this analysis's defaults for run-configuration options (e.g. fewer samples than analyze's 10000)
    defaults: ClassVar[dict[str, Any]] = {}
    #: this analysis's help for run-configuration options it reads its own way (cache: --samples of a task file)
    run_help: ClassVar[dict[str, str]] = {}
    #: whether MODEL must be given (theorems on synthetic q, k, v needs none)
    needs_model: ClassVar[bool] = True
    model_help: ClassVar[str] = ("Hugging Face hub id (roberta-base), a local directory saved with save_pretrained "
                                 "or a .gguf file; or a finished run directory, to print it again (and --plot it).")
    #: table file → its leading columns, as written (tests check every run writes them)
    outputs: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: n × n float64 matrices per head one sequence's batch holds (attention and the probes' work): the memory check
    work: ClassVar[float] = 6
    #: what calibrates on the first sequences, as the refusal to calibrate across processes names it
    calibrates: ClassVar[str] = "calibrated methods"
    #: how the command sets the sequence length, when not by --length (for the refusal of `check_evaluable`)
    length_by: ClassVar[str | None] = None
    #: the help of --all, for a kind whose printout is a summary by default (None: it prints every row anyway)
    detail: ClassVar[str | None] = None
    #: what one step of its progress is, as the progress bar counts them
    unit: ClassVar[str] = "sequences"

    # ---------------------------------------------------------------- declarations (overridden by kinds)

    def listings(self) -> dict[str, list[tuple[str, str]]]:
        """What --help lists after the options, from declarations only (no torch): section title → (name, one line)
        rows — the presses of a study of presses; none by default."""
        return {}

    def resolve(self, config: RunConfig, options: Any) -> Any:
        """The options as they run at the configured length (defaults that depend on n set, n-bound checks)."""
        return options

    def progress_unit(self, data: str | None) -> str:
        """What its progress counts on `data` (the kind it hands the data to may count otherwise)."""
        return self.unit

    def derived(self, options: Any) -> tuple[str, ...]:
        """Settings left at a default that follows from others (`loop.Job.derived`), judged before `resolve` sets
        them: a refused --resume names them only when nothing else differs."""
        return ()

    def configured(self, config: RunConfig, options: Any) -> RunConfig:
        """The run configuration the analysis runs with (e.g. the length its own options set; `samples` given as
        None: the analysis's default)."""
        if config.samples is None:
            return replace(config, samples=self.defaults.get("samples") or DEFAULT_SAMPLES)
        return config

    def check(self, config: RunConfig, options: Any, shape: checkpoints.Shape) -> None:
        """Refuse what the model's shape rules out (None fields: not known yet). Runs before and after loading."""
        if shape.positions is not None and config.length > shape.positions:
            raise SpectraError(f"{spell(f'--length {config.length}', f'length={config.length}')} exceeds what "
                               f"{shape.name} can embed ({shape.positions} tokens)")

    def check_files(self, config: RunConfig, options: Any, found: checkpoints.Source) -> None:
        """Refuse what the model's configuration file rules out, before it loads."""

    def announce(self, config: RunConfig, options: Any, reporter: Reporter, given: RunConfig) -> None:
        """What the user should know before the run starts, once the inputs are known to be good (warnings);
        `given`: the run configuration as the user gave it, before `configured` (e.g. the --samples asked for)."""

    def check_loaded(self, config: RunConfig, options: Any, source) -> None:
        """Refuse what only the loaded model shows (after `check` has run again on its shape)."""

    def calibration(self, options: Any) -> int:
        """The sequences read first to calibrate, not evaluated (`loop.Job.calibration`)."""
        return 0

    def settings(self, config: RunConfig, options: Any) -> dict[str, Any]:
        """What identifies the run: run.json's settings, compared on --resume."""
        return config.settings(identity(options))

    def meta(self, config: RunConfig, options: Any, source) -> dict[str, Any]:
        """What run.json records beside the source's description and the probes' own."""
        return identity(options)

    def source_options(self, options: Any) -> dict[str, Any]:
        """What the model source keeps beyond attention (`sources.ModelSource`'s keywords)."""
        return {}

    def source(self, config: RunConfig, options: Any, where: Any):
        """The loop's source: the corpus read through the model."""
        return model_source(config, where, **self.source_options(options))

    def target(self, config: RunConfig, options: Any, found: checkpoints.Source | None) -> tuple[Path, str]:
        """The default run directory and what owns its name (the resolved model source)."""
        return config.default_out(self.name, found.label), found.where

    def memory(self, config: RunConfig, options: Any, source) -> float:
        """Bytes one sequence's batch takes once the model has loaded (the loop's memory check): `work` n × n
        float64 matrices per head."""
        return 8.0 * self.work * source.heads * source.n ** 2

    def probe(self, config: RunConfig, options: Any, reporter: Reporter, source):
        """The probes this analysis runs, once the model has loaded."""
        raise NotImplementedError(f"{self.name} declares no probe")

    # ---------------------------------------------------------------- wiring (the same for every kind)

    def inspect(self, config: RunConfig, options: Any) -> checkpoints.Source | None:
        """The model's files as found before anything loads."""
        return checkpoints.inspect(config.model, config.gguf_file)

    def run(self, config: RunConfig, options: Any, reporter: Reporter) -> Path:
        """Check what can be checked without loading anything, run, and return the run directory."""
        derived = self.derived(options)
        given = config
        options = self.resolve(config, options)
        config = self.configured(config, options)
        found = self.inspect(config, options)
        if found is not None:
            self.check(config, options, found.shape())
            self.check_files(config, options, found)
        self.announce(config, options, reporter, given)
        from ..loop import execute  # torch: only once the inputs are known to be good

        job = replace(self.job(config, options, reporter, found), derived=derived, defaults=defaults(options))
        return execute(job, reporter)

    def job(self, config: RunConfig, options: Any, reporter: Reporter, found: checkpoints.Source | None):
        """The `loop.Job` this analysis runs, built from its declarations."""
        if type(self).probe is Analysis.probe:
            raise NotImplementedError(f"{self.name} runs no single job; it overrides run()")
        from ..loop import Job

        out, owner = self.target(config, options, found)
        return Job(self.name, config, self.settings(config, options), config.samples, out, owner,
                   open_source=lambda where: self.source(config, options, where),
                   build_probe=lambda source: self.loaded(config, options, reporter, source),
                   meta=lambda source: self.meta(config, options, source),
                   bytes_per_sequence=lambda source: self.memory(config, options, source),
                   calibration=self.calibration(options))

    def loaded(self, config: RunConfig, options: Any, reporter: Reporter, source):
        """The probe once the model has loaded: its shape checked again (a hub id's is only known now), the kind's
        own checks of the loaded model, a calibration refused where it cannot run."""
        self.check(config, options, source.shape())
        self.check_loaded(config, options, source)
        calibration = self.calibration(options)
        if calibration:
            from .. import distributed

            if distributed.requested():
                raise SpectraError(f"{self.calibrates} ({spell('--fit-samples', 'fit_samples')}) are not supported "
                                   "across processes yet; run with a single process")
            check_evaluable(source, calibration, config, self.length_by)
        return self.probe(config, options, reporter, source)

    # ---------------------------------------------------------------- the read side

    def read_side(self):
        """The module of this analysis's read side, `spectra/report/<name>.py` — its run object, `load(path, meta)`,
        `show(run)` and `plot(run, out)` — imported when a run is read (it may import pandas); None without one."""
        module = f"spectra.report.{self.name}"
        return importlib.import_module(module) if importlib.util.find_spec(module) is not None else None

    def load(self, path: Path, meta: dict[str, Any]):
        """The finished run at `path` as its run object."""
        side = self.read_side()
        if side is None:
            raise NotImplementedError(f"{self.name} has no read side (spectra/report/{self.name}.py)")
        return side.load(path, meta)

    def show(self, run, every: bool = False) -> None:
        """Print the run's tables to the terminal (`every`: every row, for a kind that declares `detail`)."""
        side = self.read_side()
        if side is not None:
            side.show(run, every=True) if every and self.detail else side.show(run)

    def plot(self, run, out: str | Path | None = None) -> list[Path]:
        """Draw the run's figures (PNG and PDF) into `out` (default: the run directory's figures/)."""
        side = self.read_side()
        return side.plot(run, out) if side is not None else []


def model_source(config: RunConfig, where: Any, **options: Any):
    """The corpus read through the model (`sources.ModelSource`), imported when a run starts."""
    from ..sources import ModelSource

    return ModelSource(config, where, **options)


def check_selection(layers: tuple[int, ...] | None, heads: tuple[int, ...] | None,
                    shape: checkpoints.Shape) -> None:
    """Chosen layers and heads must exist in the model (checked when its shape is known)."""
    for chosen, count, name in ((layers, shape.layers, "--layers"), (heads, shape.heads, "--heads")):
        if chosen is not None and count is not None and (chosen[0] < 0 or chosen[-1] >= count):
            raise SpectraError(f"{spell(name)} must lie in 0…{count - 1} for {shape.name}, got {list(chosen)}")


def check_evaluable(source, fit_samples: int, config: RunConfig, length: str | None = None) -> None:
    """Refuse calibration sequences that leave none to evaluate: the corpus is read (tokenized, no model pass) up
    to `fit_samples` + 1 sequences, before any calibration or evaluation work. `length`: how the command sets the
    sequence length, when not by --length (spectra cache: --context and --continuation)."""
    from .. import data

    tokenizer = source.loaded.tokenizer
    yielded = sum(1 for _ in islice(data.sequences(tokenizer, source.corpus, config.length, config.mode),
                                    fit_samples + 1))
    if yielded > fit_samples:
        return
    gives = f"{yielded} sequence{'s' if yielded != 1 else ''}"
    asked = spell(f"--fit-samples {fit_samples}", f"fit_samples={fit_samples}")
    where = spell(f"--length {config.length} --mode {config.mode}", f"length={config.length}, mode='{config.mode}'")
    if length is not None:
        where = f"{config.length} tokens a sequence, {spell(f'--mode {config.mode}', f'mode={config.mode!r}')}"
    raise SpectraError(
        f"{asked} leaves no sequence to evaluate: the corpus gives {'only ' if yielded < fit_samples else ''}{gives} "
        f"at {where}; pass fewer calibration sequences ({spell('--fit-samples', 'fit_samples')} < {yielded}), more "
        f"text or {length or 'a smaller ' + spell('--length')}")


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
    sequences (as --samples does) counted every sequence read under `samples`: that count becomes `sequences`. A task
    study written by `spectra cache` before the study was its own kind (kind "cache", protocol "tasks") is an
    `evaluate` run."""
    if meta.get("kind") == "cache" and meta.get("protocol") == "tasks":  # a task study written before it was a kind
        meta = {key: value for key, value in meta.items() if key != "protocol"} | {"kind": "evaluate"}
    if "evaluation" in meta and "sequences" not in meta and isinstance(meta.get("samples"), int):
        first = int(meta["evaluation"][0])
        meta = {**meta, "sequences": meta["samples"], "samples": max(0, meta["samples"] - first)}
    return meta


def load_run(path: str | Path, kind: str | None = None):
    """A finished run directory (or published folder) read back as its analysis's run object; `kind` (e.g.
    "analyze") refuses any other kind in one line, and a published folder whose form is not the run itself (an
    analyze run's: its tables without the curves, `report.published`)."""
    from ..report.published import PUBLISHED

    path = Path(path)
    meta = read_meta(path)
    found = meta.get("kind")
    if found not in REGISTRY:
        raise SpectraError(f"{path} holds a '{found}' run, which this version of spectra cannot read")
    if kind is not None and found != kind:
        raise SpectraError(f"{path} holds a run of 'spectra {found}'; this needs a run of 'spectra {kind}'")
    if kind is not None and PUBLISHED in meta and kind != "evaluate":
        raise SpectraError(f"{path} is a published {found} run: it holds the run's tables, not the arrays this needs; "
                           "give its run directory")
    try:
        return REGISTRY[found].load(path, meta)
    except (OSError, ValueError, KeyError) as error:
        raise SpectraError(f"{path} is not a readable spectra run: {error}") from None
