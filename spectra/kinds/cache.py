"""`spectra cache`: how much of a decoder's key–value cache can be dropped, which way, and at what loss.

Each sequence is L = `context` tokens followed by C = `continuation` tokens. The context is prefilled exactly; each
press (spectra/presses/, kvpress 0.5.5's at their defaults) compresses each layer's cache once at each ratio; the
continuation is scored against the compressed cache with its original RoPE positions L … L + C − 1. One prefill
per sequence serves every press and ratio (probe: `probes.cache.CacheProbe`, engine: `spectra.kvcache`).
`decoding(<decodable>)` (kvpress's DecodingPress, `presses.decoding`) compresses nothing after the prefill: the
continuation is fed one decoding step per token, as kvpress would decode it with each generated token replaced by
the text's next one, and every `--compression-interval` steps each layer's cache is brought back to the rows the
ratio keeps of the context (`decoding.teacher_forced`).

Tables: cache.csv (per press and ratio, the full cache as press 'full' at ratio 0), cache_heads.csv (per press,
ratio, layer and head), cache_sequences.csv (per press, ratio and sequence); with `--bytes-kept`, cache_axes.csv (per
byte budget, layer and key/value head, the loss of each axis — tokens, key channels, rank, bits — and the best,
`spectra.axes`). Loads as `runs.CacheRun`.

The axis map is an option of this analysis, not one of its own: the per-head output error and the per-head bytes it
reads are what this probe measures anyway, on the same prefill, for every press and ratio; a separate analysis would
prefill and compress everything again to compute the same rows.

A task file (kvpress's records: `tasks.records.is_task_file`) runs the long-context task protocol instead: its
configuration, checks, source, probe, run.json and memory are `spectra.tasks.protocol`'s declarations, chosen here
by the data's format, and the base builds the loop's job from them as for any other data; answers are decoded
greedily from each compressed cache and scored; the run loads as `report.tasks.TaskRun`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import checkpoints, registry
from ..config import RunConfig
from ..errors import SpectraError, spell
from ..inputs import path_text, several
from ..options import option
from ..registry import PRESSES
from ..reporter import Reporter
from .base import Analysis, load_run, register

#: the ratios measured when none are given
DEFAULT_RATIOS = (0.25, 0.5, 0.75, 0.9)
#: the NLL protocol's context and continuation when none are given (a task file's records set their own)
DEFAULT_CONTEXT, DEFAULT_CONTINUATION = 1024, 128
#: model configuration fields that say the model rotates queries and keys (RoPE)
ROPE_FIELDS = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim")
#: kvpress's DecodingPress compresses every 512 decoding steps by default
DEFAULT_INTERVAL = PRESSES.facts("decoding")["interval"]
#: SnapKV's window (loki's too): they need a longer context
SNAPKV_WINDOW = PRESSES.facts("snapkv")["window"]
#: the sequences of a text corpus evaluated when --samples is not given (a task file runs whole)
CORPUS_SAMPLES = 16


@dataclass(frozen=True)
class CacheOptions:
    """The context prefilled exactly, the continuation scored, and the presses and ratios compared."""

    context: int | None = option(None, "L: context tokens prefilled exactly and then compressed (special tokens "
                                 f"included; default {DEFAULT_CONTEXT}). A text corpus only: a task file's records "
                                 "hold their contexts.")
    continuation: int | None = option(None, "C: tokens scored after the context against the compressed cache (each "
                                      f"sequence is L + C tokens; default {DEFAULT_CONTINUATION}). A text corpus "
                                      "only.")
    presses: tuple[str, ...] = option(PRESSES.bare(), f"Comma-separated presses: {PRESSES.listing()} (<scorer>: "
                                      f"one of {', '.join(sorted(PRESSES.having('scorer')))}; <decodable>: one of "
                                      f"{', '.join(sorted(PRESSES.having('decodable')))}, decoding(<decodable>) being "
                                      "kvpress's DecodingPress: the cache brought back to the ratio's size every "
                                      "--compression-interval decoding steps, nothing compressed after the prefill; "
                                      "<pattern>: a directory with DuoAttention's full_attention_heads.tsv and "
                                      "config.json, such as a `spectra heads` run; <run>: an analyze or heads run, "
                                      "<run>@rank to weigh heads by rank; <cache run>: a run with --bytes-kept; "
                                      "docs/cache.md explains each).")
    ratios: tuple[float, ...] = option(DEFAULT_RATIOS, "Comma-separated compression ratios in [0, 1): the fraction "
                                       "of cached tokens removed (for think: of key channels, the memory saved "
                                       "half of it; for duo: of key/value heads streaming; kivi2/4/8 ignore it). "
                                       "The full cache (ratio 0) is always measured.")
    fit_samples: int = option(0, "Calibration sequences for the presses that fit (loki, lowrank), read first and "
                              "not evaluated; --samples more are evaluated after them with the fit frozen. 0: each "
                              "of those presses fits on the context it compresses (an oracle).")
    compression_interval: int = option(DEFAULT_INTERVAL, "Decoding steps between two compressions of a "
                                       "decoding(<decodable>) press (kvpress's compression_interval; the NLL protocol "
                                       "feeds the continuation one token a step).")
    query_aware: bool = option(False, "A task file only: compress the context with the question appended "
                               "(kvpress's evaluation convention); by default the question is appended after "
                               "compression.")
    bytes_kept: tuple[float, ...] = option((), "Comma-separated byte budgets in (0, 1], shares of the context cache's "
                                           "bytes: cache_axes.csv maps, per layer and key/value head, which axis "
                                           "(tokens, key channels, rank, bits) loses least within each, from the "
                                           "presses and ratios measured (the NLL protocol).")
    heads_run: str | None = option(None, "A heads run of the same model (its directory): its diagnosis joined to "
                                   "cache_axes.csv per layer and key/value head (needs --bytes-kept).", metavar="RUN")

    def __post_init__(self) -> None:
        object.__setattr__(self, "presses", registry.press_names(several(self.presses, "--presses")))
        ratios = several(self.ratios, spell("--ratios"), float)
        for ratio in ratios:
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
                raise SpectraError(f"{spell('--ratios')} must lie in [0, 1) (the fraction of the cache removed), "
                                   f"got {ratio}")
        object.__setattr__(self, "ratios", tuple(sorted({float(ratio) for ratio in ratios if ratio > 0})))
        if not self.ratios:
            raise SpectraError(f"{spell('--ratios')} holds no ratio above 0 (the full cache is always measured); "
                               f"pass e.g. {spell('--ratios 0.25,0.5', 'ratios=(0.25, 0.5)')}")
        for name, least in (("context", 2), ("continuation", 2)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise SpectraError(f"{spell('--' + name)} must be an integer ≥ {least}, got {value!r}")
        windowed = [press for press in self.presses if press in PRESSES.having("windowed")]
        if windowed and self.context is not None and self.context <= SNAPKV_WINDOW:
            raise SpectraError(f"{windowed[0]} reads the last {SNAPKV_WINDOW} context queries: it needs "
                               f"{spell('--context')} > {SNAPKV_WINDOW}, got {self.context}")
        interval = self.compression_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise SpectraError(f"{spell('--compression-interval')} must be an integer ≥ 1, got {interval!r}")
        if interval != DEFAULT_INTERVAL and not self.decoding:
            raise SpectraError(f"{spell('--compression-interval')} paces the decoding presses, but none is among "
                               f"{spell('--presses')}; add one (e.g. decoding(knorm)) or drop "
                               f"{spell('--compression-interval')}")
        if isinstance(self.fit_samples, bool) or not isinstance(self.fit_samples, int) or self.fit_samples < 0:
            raise SpectraError(f"{spell('--fit-samples')} must be an integer ≥ 0, got {self.fit_samples!r}")
        budgets = several(self.bytes_kept, spell("--bytes-kept"), float)
        for budget in budgets:
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
                raise SpectraError(f"{spell('--bytes-kept')} must lie in (0, 1] (a share of the context cache's "
                                   f"bytes), got {budget}")
        object.__setattr__(self, "bytes_kept", tuple(sorted({float(budget) for budget in budgets})))
        heads_run = path_text(self.heads_run)
        if heads_run is not None and not self.bytes_kept:
            raise SpectraError(f"{spell('--heads-run')} is joined to the axis map: give "
                               f"{spell('--bytes-kept 0.25', 'bytes_kept=0.25')} too")
        object.__setattr__(self, "heads_run", None if heads_run is None else str(Path(heads_run).absolute()))
        for press in self.presses:  # a mixed plan plays its map's budgets only: refused here, not after the prefill
            parts = registry.applied(press)
            if parts is not None and parts[0] == "mixed":
                from ..axes import check_plan_ratios

                check_plan_ratios(parts[1], self.ratios)
        if self.fit_samples and not self.calibrating:
            raise SpectraError(f"{spell('--fit-samples')} calibrates the presses that fit "
                               f"({', '.join(sorted(PRESSES.having('calibrates')))}), but none is among "
                               f"{spell('--presses')}; add one or drop {spell('--fit-samples')}")

    @property
    def decoding(self) -> tuple[str, ...]:
        """The chosen presses that compress while decoding (decoding(<decodable>))."""
        return tuple(press for press in self.presses if press in PRESSES.having("decodes"))

    @property
    def calibrating(self) -> tuple[str, ...]:
        """The chosen presses that fit on calibration sequences."""
        return tuple(press for press in self.presses if press in PRESSES.having("calibrates"))

    @property
    def length(self) -> int:
        return self.context + self.continuation


def warn_window_filled(options: CacheOptions, reporter: Reporter) -> None:
    """Before the run: the ratios at which the windowed presses keep only tokens of their window, where their scores
    choose nothing (`presses.base.window_note`), and the context that lets them choose at every ratio. Said, not
    refused: the rows are true measurements of what those presses keep there."""
    windowed = set(options.presses) & PRESSES.having("windowed")
    if not windowed:
        return
    from ..presses.base import window_choosing_length, window_note

    note = window_note(options.context, options.ratios, options.presses)
    if note is not None:
        reporter.warn(f"at a context of {options.context} tokens, {note}; a context of "
                      f"{window_choosing_length(options.ratios)} tokens or more lets "
                      f"{'them' if len(windowed) > 1 else 'it'} choose at every ratio")


def check_patterns(options: CacheOptions, layers: int | None, kv_heads: int | None, name: str) -> None:
    """Refuse (one line) a `duo(DIR)` pattern or a `headbudget(DIR)` run that does not have the model's layers ×
    key/value heads."""
    from .. import headpattern, headweights
    from ..registry import applied

    for press in options.presses:
        parts = applied(press)
        if parts is not None and parts[0] == "duo":
            headpattern.fits(headpattern.read(parts[1]), layers, kv_heads, name, parts[1])
        if parts is not None and parts[0] == "headbudget":
            weights = headweights.read(parts[1])
            headpattern.fits(headpattern.HeadPattern(weights, 0, 0), layers, kv_heads, name, parts[1])


def rotary(config: dict[str, Any]) -> bool:
    """Whether a model's config says it uses rotary positions."""
    return any(config.get(name) for name in ROPE_FIELDS)


class Cache(Analysis):
    """Compress a decoder's KV cache after an exact prefill and score what follows, press by press."""

    name = "cache"
    run_type = "CacheRun"
    summary = ("Compress a decoder's key–value cache after an exact prefill (kvpress's presses) and score the "
               "continuation: NLL, KL and top-1 agreement per press and ratio, attention mass kept per head.")
    options = CacheOptions
    run_fields = tuple(name for name in Analysis.run_fields if name != "length")
    defaults = {"samples": None, "batch_size": 1}  # None: 16 sequences of a corpus, every record of a task file
    run_help = {"samples": f"Sequences of a text corpus (default {CORPUS_SAMPLES}); records of a task file (default: "
                           "all), spread evenly over its tasks and lengths (seeded by --seed)."}
    model_help = ("A decoder: Hugging Face hub id (HuggingFaceTB/SmolLM2-135M-Instruct), a local directory saved with "
                  "save_pretrained or a .gguf file; or a finished run directory, to print it again (and --plot it).")
    work = 4
    calibrates = "calibrated presses"
    length_by = f"a shorter {spell('--context')} + {spell('--continuation')}"
    outputs = {"cache.csv": ("press", "ratio", "nll"), "cache_heads.csv": ("press", "ratio", "layer", "head"),
               "cache_sequences.csv": ("press", "ratio", "sequence")}

    def check(self, config: RunConfig, options: CacheOptions, shape: checkpoints.Shape) -> None:
        check_patterns(options, shape.layers, shape.kv_heads, shape.name)
        if tasks(config):
            return protocol().check(options, shape, config.data)
        if options.heads_run is not None:
            model = load_run(options.heads_run, "heads").meta.get("model", {})
            for what, theirs, ours in (("layers", model.get("layers"), shape.layers),
                                       ("heads", model.get("heads"), shape.heads)):
                if ours is not None and theirs != ours:
                    raise SpectraError(f"{spell('--heads-run')} {options.heads_run} is a run of {model.get('name')} "
                                       f"with {theirs} {what}, but {shape.name} has {ours}: give a heads run of "
                                       "this model")
        if shape.causal is False:
            raise SpectraError(f"{shape.name} is an encoder: a key–value cache belongs to a decoder (a causal "
                               "language model, e.g. Llama, Qwen2, SmolLM2)")
        if shape.positions is not None and options.length > shape.positions:
            raise SpectraError(f"{spell('--context')} {options.context} + {spell('--continuation')} "
                               f"{options.continuation} = {options.length} tokens exceeds what {shape.name} can embed "
                               f"({shape.positions} positions); shorten them")

    def check_rope(self, options: CacheOptions, uses_rope: bool | None, name: str) -> None:
        """Channel presses score rotated key channels: a model without RoPE is refused."""
        channel = [press for press in options.presses if press in PRESSES.having("needs_rope")]
        if channel and uses_rope is False:
            raise SpectraError(f"{channel[0]} prunes rotary key channels, but {name} has no rotary position "
                               f"embedding (RoPE); choose presses among "
                               f"{', '.join(p for p in PRESSES if p not in PRESSES.having('needs_rope'))}")

    def load(self, path: Path, meta: dict[str, Any]):
        """A task run reads back through the task protocol's read side (`report/tasks.py`), any other through
        `report/cache.py`."""
        if meta.get("protocol") == "tasks":
            from ..report import tasks

            return tasks.load_tasks(path, meta)
        return super().load(path, meta)

    def show(self, run) -> None:
        from ..report import tasks

        tasks.print_tasks(run) if isinstance(run, tasks.TaskRun) else super().show(run)

    def plot(self, run, out: str | Path | None = None) -> list[Path]:
        from ..report import tasks

        return tasks.plot_tasks(run, out) if isinstance(run, tasks.TaskRun) else super().plot(run, out)

    def resolve(self, config: RunConfig, options: CacheOptions) -> CacheOptions:
        """The options of the data's protocol, with those of the other refused (before anything loads): the NLL
        protocol's --context and --continuation on a task file whenever given (their defaults are left unset, so
        a value typed is told from the default even when it equals it), --query-aware on a text corpus; the NLL
        protocol's defaults set for a text corpus."""
        name = Path(config.data).name
        if tasks(config):
            given = [spell("--" + field) for field in ("context", "continuation") if getattr(options, field) is not None]
            if given:
                raise SpectraError(f"{' and '.join(given)} set{'s' if len(given) == 1 else ''} the text a sequence of "
                                   f"the NLL protocol prefills and scores; {name} is a task file, which runs the task "
                                   "protocol: each record holds its context, question and answer. Drop "
                                   f"{' and '.join(given)}, or give a text corpus")
            return options
        if options.query_aware:
            raise SpectraError(f"{spell('--query-aware', 'query_aware=True')} appends a task record's question to the "
                               f"context compressed (the task protocol); {name} is a text corpus, which runs the NLL "
                               f"protocol and has no question. Drop it, or give a task file (spectra tasks writes one)")
        return replace(options, context=DEFAULT_CONTEXT if options.context is None else options.context,
                       continuation=DEFAULT_CONTINUATION if options.continuation is None else options.continuation)

    def configured(self, config: RunConfig, options: CacheOptions) -> RunConfig:
        if tasks(config):
            if options.bytes_kept:  # refused first, before the records are read
                raise SpectraError(f"{spell('--bytes-kept')} maps the per-head output error of the NLL protocol; a "
                                   "task file runs the task protocol, which decodes answers and measures no such "
                                   "error: drop it, or give a text corpus")
            return protocol().configured(config)
        return replace(config, length=options.length, samples=config.samples or CORPUS_SAMPLES)

    def announce(self, config: RunConfig, options: CacheOptions, reporter: Reporter) -> None:
        protocol().announce(config, reporter) if tasks(config) else warn_window_filled(options, reporter)

    def check_files(self, config: RunConfig, options: CacheOptions, found: checkpoints.Source) -> None:
        if found.local and found.gguf_file is None:
            self.check_rope(options, rotary(found.config), found.shape().name)

    def check_loaded(self, config: RunConfig, options: CacheOptions, source) -> None:
        from .. import models

        loaded = source.loaded
        if loaded.head is None:
            raise SpectraError(f"{loaded.name} has no language-model head: spectra cache scores next-token predictions")
        self.check_rope(options, models.rotary(loaded.model), loaded.name)

    def calibration(self, options: CacheOptions) -> int:
        return options.fit_samples

    def source_options(self, options: CacheOptions) -> dict[str, Any]:
        return {"lm_head": True, "keep_logits": options.continuation + 1, "fit_samples": options.fit_samples}

    def source(self, config: RunConfig, options: CacheOptions, where: Any):
        return protocol().source(config, options, where) if tasks(config) else super().source(config, options, where)

    def meta(self, config: RunConfig, options: CacheOptions, source) -> dict[str, Any]:
        return protocol().meta(options) if tasks(config) else super().meta(config, options, source)

    def memory(self, config: RunConfig, options: CacheOptions, source) -> float:
        return protocol().memory(source) if tasks(config) else super().memory(config, options, source)

    def probe(self, config: RunConfig, options: CacheOptions, reporter: Reporter, source):
        """The cache probe (the task probe on a task file), once the model has loaded."""
        if tasks(config):
            return protocol().probe(config, options, source)
        from ..probes.cache import CacheProbe

        diagnosis = None if options.heads_run is None else load_run(options.heads_run, "heads").diagnosis
        return CacheProbe(source, options.presses, options.ratios, options.context, options.continuation,
                          config.seed, range(options.fit_samples, options.fit_samples + config.samples),
                          options.bytes_kept, diagnosis, options.compression_interval)


def protocol():
    """The task protocol's declarations (`spectra.tasks.protocol`), imported when a run reads a task file."""
    from ..tasks import protocol

    return protocol


def tasks(config: RunConfig) -> bool:
    """Whether the run's data is a task file (kvpress's records), which runs the task protocol."""
    return protocol().wants_tasks(config.data)


register(Cache())
