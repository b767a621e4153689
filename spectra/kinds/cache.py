"""`spectra cache`: how much of a decoder's key–value cache can be dropped, which way, and at what loss.

Each sequence is L = `context` tokens followed by C = `continuation` tokens. The context is prefilled exactly; each
press (spectra/presses/, kvpress 0.5.5's at their defaults) compresses each layer's cache once at each ratio; the
continuation is scored against the compressed cache with its original RoPE positions L … L + C − 1. One prefill
per sequence serves every press and ratio (probe: `probes.cache.CacheProbe`, engine: `spectra.kv.continuation`).
`decoding(<decodable>)` (kvpress's DecodingPress, `presses.decoding`) compresses nothing after the prefill: the
continuation is fed one decoding step per token, as kvpress would decode it with each generated token replaced by
the text's next one, and every `--compression-interval` steps each layer's cache is brought back to the rows the
ratio keeps of the context (`generation.teacher_forced`). On a model with sliding-window layers (Gemma 3) a local
layer holds and attends its window (`--local-layers`: what a press does to it, `kv.locallayers`; the continuation
attends as the model does, `kv.continuation`), and the bytes count what each layer stores.

Tables: cache.csv (per press and ratio, the full cache as press 'full' at ratio 0), cache_heads.csv (per press,
ratio, layer and head), cache_sequences.csv (per press, ratio and sequence); with `--bytes-kept`, cache_axes.csv (per
byte budget, layer and key/value head, the loss of each axis — tokens, key channels, rank, bits — and the best,
`spectra.kv.axes`). Loads as `report.cache.CacheRun`.

The axis map is an option of this analysis, not one of its own: the per-head output error and the per-head bytes it
reads are what this probe measures anyway, on the same prefill, for every press and ratio; a separate analysis would
prefill and compress everything again to compute the same rows.

A task file (kvpress's records) is the task study's data: `spectra cache MODEL --data F.jsonl` hands it to
`spectra evaluate` (`kinds/evaluate.py`, through the registry), with the options the two studies share (`PressOptions`)
and `--query-aware`; an option only the NLL study takes is refused there, and `--query-aware` on text here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .. import checkpoints
from ..config import RunConfig
from ..errors import SpectraError, spell
from ..inputs import path_text, several
from ..options import option
from ..registry import PRESSES
from ..reporter import Reporter
from ..kv.tasks.selection import wants_tasks
from .base import REGISTRY, Analysis, load_run, register
from .pressbase import DECODE_GIB, DECODE_HELP, PressOptions, PressStudy, check_decode_memory

#: the NLL protocol's context and continuation when none are given (a task file's records set their own)
DEFAULT_CONTEXT, DEFAULT_CONTINUATION = 1024, 128
#: the last context queries the windowed presses read (the widest window a press declares, SnapKV's): they need a
#: longer context
WINDOW = PRESSES.most("window")
#: the sequences of a text corpus evaluated when --samples is not given (a task file runs whole)
CORPUS_SAMPLES = 16


@dataclass(frozen=True)
class CacheOptions(PressOptions):
    """The context prefilled exactly, the continuation scored, and the presses and ratios compared."""

    context: int | None = option(None, "L: context tokens prefilled exactly and then compressed (special tokens "
                                 f"included; default {DEFAULT_CONTEXT}). A text corpus only: a task file's records "
                                 "hold their contexts.")
    continuation: int | None = option(None, "C: tokens scored after the context against the compressed cache (each "
                                      f"sequence is L + C tokens; default {DEFAULT_CONTINUATION}). A text corpus "
                                      "only.")
    fit_samples: int = option(0, "Calibration sequences for the presses that fit (loki, lowrank), read first and "
                              "not evaluated; --samples more are evaluated after them with the fit frozen. 0: each "
                              "of those presses fits on the context it compresses (an oracle).")
    query_aware: bool = option(False, "A task file only (which runs `spectra evaluate`): compress the context "
                               "with the question appended (kvpress's evaluation convention); by default the question "
                               "is appended after compression.")
    decode_memory: float = option(DECODE_GIB, DECODE_HELP, metavar="GIB", identity=False)
    bytes_kept: tuple[float, ...] = option((), "Comma-separated byte budgets in (0, 1], shares of the context cache's "
                                           "bytes: cache_axes.csv maps, per layer and key/value head, which axis "
                                           "(tokens, key channels, rank, bits) loses least within each, from the "
                                           "presses and ratios measured (the NLL protocol).")
    heads_run: str | None = option(None, "A heads run of the same model (its directory): its diagnosis joined to "
                                   "cache_axes.csv per layer and key/value head (needs --bytes-kept).", metavar="RUN")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_decode_memory(self.decode_memory)
        for name, least in (("context", 2), ("continuation", 2)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise SpectraError(f"{spell('--' + name)} must be an integer ≥ {least}, got {value!r}")
        windowed = [press for press in self.presses if press in PRESSES.having("windowed")]
        if windowed and self.context is not None and self.context <= WINDOW:
            raise SpectraError(f"{windowed[0]} reads the last {WINDOW} context queries: it needs "
                               f"{spell('--context')} > {WINDOW}, got {self.context}")
        short = [(press, PRESSES.facts(press).get("min_context", 0)) for press in self.presses]
        short = [(press, least) for press, least in short if self.context is not None and self.context < least]
        if short:
            raise SpectraError(f"{short[0][0]} compresses contexts of at least {short[0][1]} tokens: it needs "
                               f"{spell('--context')} ≥ {short[0][1]}, got {self.context}")
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
        if self.fit_samples and not self.calibrating_presses:
            fitting = sorted(PRESSES.having("calibrates") & set(PRESSES.bare()))  # declared, not resolved earlier
            raise SpectraError(f"{spell('--fit-samples')} calibrates the presses that fit ({', '.join(fitting)}), "
                               f"but none is among {spell('--presses')}; add one or drop {spell('--fit-samples')}")

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
    from ..kv.presses.window import window_choosing_length, window_note

    note = window_note(options.context, options.ratios, options.presses)
    if note is not None:
        reporter.warn(f"at a context of {options.context} tokens, {note}; a context of "
                      f"{window_choosing_length(options.ratios)} tokens or more lets "
                      f"{'them' if len(windowed) > 1 else 'it'} choose at every ratio")


class Cache(PressStudy):
    """Compress a decoder's KV cache after an exact prefill and score what follows, press by press."""

    name = "cache"
    run_type = "CacheRun"
    summary = ("Compress a decoder's key–value cache after an exact prefill (kvpress's presses) and score the "
               "continuation: NLL, KL and top-1 agreement per press and ratio, attention mass kept per head.")
    options = CacheOptions
    run_fields = tuple(name for name in Analysis.run_fields if name != "length")
    defaults = {"samples": None, "batch_size": 1}  # None: 16 sequences of a corpus, every record of a task file
    run_help = {"samples": f"Sequences of a text corpus (default {CORPUS_SAMPLES}); records of a task file (default: "
                           "all), spread evenly over its tasks and lengths (seeded by --seed).",
                "batch_size": "Sequences per forward pass of a text corpus; on a task file, the examples whose cells "
                              "decode together (the results do not depend on it)."}
    #: a task file is handed to the task study, whose runs this command therefore prints too
    hands_to = ("evaluate",)
    work = 4
    calibrates = "calibrated presses"
    length_by = f"a shorter {spell('--context')} + {spell('--continuation')}"
    outputs = {"cache.csv": ("press", "ratio", "nll"), "cache_heads.csv": ("press", "ratio", "layer", "head"),
               "cache_sequences.csv": ("press", "ratio", "sequence")}

    def progress_unit(self, data: str | None) -> str:
        """Examples on a task file (the task study runs it), else sequences."""
        return REGISTRY[self.hands_to[0]].unit if data is not None and wants_tasks(data) else self.unit

    def run(self, config: RunConfig, options: CacheOptions, reporter: Reporter) -> Path:
        """The NLL study on a text corpus; a task file is handed to the task study (`spectra evaluate`) with the
        options the two share, an option only this study takes refused first (before anything is read)."""
        if not wants_tasks(config.data):
            return super().run(config, options, reporter)
        study = REGISTRY[self.hands_to[0]]
        given = [spell("--" + name.replace("_", "-"), name) for name in ("context", "continuation", "bytes_kept",
                                                                          "heads_run", "fit_samples")
                 if getattr(options, name) not in (None, (), 0)]
        if given:
            raise SpectraError(f"{' and '.join(given)} belong{'s' if len(given) == 1 else ''} to the NLL study of "
                               f"text; {Path(config.data).name} is a task file, which runs the task study "
                               f"(spectra {study.name}): each record holds its context, question and answer. Drop "
                               f"{' and '.join(given)}, or give a text corpus")
        theirs = {field.name for field in fields(study.options)}
        shared = {field.name: getattr(options, field.name) for field in fields(options) if field.name in theirs}
        return study.run(config, study.options(**shared), reporter)

    def check(self, config: RunConfig, options: CacheOptions, shape: checkpoints.Shape) -> None:
        super().check(config, options, shape)
        if options.heads_run is not None:
            model = load_run(options.heads_run, "heads").meta.get("model", {})
            for what, theirs, ours in (("layers", model.get("layers"), shape.layers),
                                       ("heads", model.get("heads"), shape.heads)):
                if ours is not None and theirs != ours:
                    raise SpectraError(f"{spell('--heads-run')} {options.heads_run} is a run of {model.get('name')} "
                                       f"with {theirs} {what}, but {shape.name} has {ours}: give a heads run of "
                                       "this model")
        if shape.positions is not None and options.length > shape.positions:
            raise SpectraError(f"{spell('--context')} {options.context} + {spell('--continuation')} "
                               f"{options.continuation} = {options.length} tokens exceeds what {shape.name} can embed "
                               f"({shape.positions} positions); shorten them")

    def resolve(self, config: RunConfig, options: CacheOptions) -> CacheOptions:
        """The NLL study's defaults for --context and --continuation (left unset until here, so a value typed on a
        task file is told from the default); --query-aware, the task study's, refused on text."""
        if options.query_aware:
            raise SpectraError(f"{spell('--query-aware', 'query_aware=True')} appends a task record's question to the "
                               f"context compressed (the task study, spectra evaluate); {Path(config.data).name} is a "
                               "text corpus, which runs the NLL study and has no question. Drop it, or give a task "
                               "file (spectra tasks writes one)")
        if options.decode_memory != DECODE_GIB:
            raise SpectraError(f"{spell('--decode-memory', 'decode_memory')} sizes the batches in which a task file's "
                               f"answers decode (the task study, spectra evaluate); {Path(config.data).name} is a text "
                               "corpus, whose continuations are scored, not decoded. Drop it, or give a task file")
        return replace(options, context=DEFAULT_CONTEXT if options.context is None else options.context,
                       continuation=DEFAULT_CONTINUATION if options.continuation is None else options.continuation)

    def configured(self, config: RunConfig, options: CacheOptions) -> RunConfig:
        return replace(config, length=options.length, samples=config.samples or CORPUS_SAMPLES)

    def announce(self, config: RunConfig, options: CacheOptions, reporter: Reporter, given: RunConfig) -> None:
        warn_window_filled(options, reporter)

    def calibration(self, options: CacheOptions) -> int:
        return options.fit_samples

    def source_options(self, options: CacheOptions) -> dict[str, Any]:
        return {"lm_head": True, "keep_logits": options.continuation + 1, "fit_samples": options.fit_samples}

    def probe(self, config: RunConfig, options: CacheOptions, reporter: Reporter, source):
        """The cache probe, once the model has loaded."""
        from ..probes.cache import CacheProbe

        diagnosis = None if options.heads_run is None else load_run(options.heads_run, "heads").diagnosis
        return CacheProbe(source, options.presses, options.ratios, options.context, options.continuation,
                          config.seed, range(options.fit_samples, options.fit_samples + config.samples),
                          options.bytes_kept, diagnosis, options.compression_interval, options.local_layers)


register(Cache())
