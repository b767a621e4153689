"""What the two studies of a compressed key–value cache share: the presses and ratios they compare, and the checks
a press puts on a model.

The NLL study (`spectra cache` on text, `kinds/cache.py`) and the task study (`spectra evaluate`, or `spectra cache`
on a task file, `kinds/evaluate.py`) each declare their options as a `PressOptions` subclass and their kind as a
`PressStudy`: the presses (spectra/presses/, kvpress 0.5.5's at their defaults, and those that take an argument),
the ratios, the decoding presses' compression interval, what a press does to a sliding-window layer
(`--local-layers`, `kv.locallayers`, with the presses each mode refuses by their facts), and the refusals that follow
from the model (an encoder, no language-model head, a channel press without RoPE, a head pattern of another shape,
local layers a press's pass does not follow) are written here once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .. import checkpoints, registry
from ..config import LocalLayers, RunConfig, choose
from ..errors import SpectraError, spell
from ..inputs import several, split_top
from ..kv.axes import ratio_meaning
from ..kv.passes import WHOLE_MODEL, unwindowed
from ..options import option
from ..registry import PRESSES
from .base import Analysis

#: the ratios measured when none are given
DEFAULT_RATIOS = (0.25, 0.5, 0.75, 0.9)
#: model configuration fields that say the model rotates queries and keys (RoPE)
ROPE_FIELDS = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim")
#: the last context queries the prefill keeps for the presses (the widest window a press reads)
WINDOW = PRESSES.most("window")
#: how many decoding steps kvpress's DecodingPress waits between compressions by default, as decoding(…) declares it
DEFAULT_INTERVAL = PRESSES.facts("decoding")["interval"]
def default_presses() -> tuple[str, ...]:
    """The presses `--presses` runs when none is given: every press named alone but those reading a whole-model pass
    (`kv.passes`: KVzip's reconstruction, KVCompose's replay, KVgrad's gradients, each costing a few prefills more;
    run when named, or with `registry.ALL`), so a default run costs one prefill per sequence."""
    return tuple(name for name in PRESSES.bare() if name not in PRESSES.having(WHOLE_MODEL))


#: the presses named alone that run a whole-model pass of their own after the prefill, which the default leaves out
EXTRA_PASSES = tuple(name for name in PRESSES.bare() if name not in default_presses())
#: GiB the caches of a task example's cells decoded together may take (`--decode-memory`)
DECODE_GIB = 2.0
DECODE_HELP = ("A task file only: GiB the compressed caches of a batch's cells (--batch-size examples') may take "
               "while they decode together (more cells per batch: faster; the group is cut where it would exceed "
               "this).")
BATCH_HELP = ("Examples whose cells decode together, one forward pass per step for all their answers (each example "
              "still prefilled alone, the batch holding that many prefills; the answers do not depend on it beyond "
              "float rounding; it saves little: 9% at 8 on an H100, nothing on a CPU).")


def check_decode_memory(gib: float) -> None:
    """Refuse a --decode-memory that is no positive number of GiB."""
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0:
        raise SpectraError(f"{spell('--decode-memory', 'decode_memory')} must be a positive number of GiB, got {gib!r}")


def smallest_gib(needed: float) -> str:
    """`needed` bytes (> 0) as the GiB to type: rounded up at three significant digits."""
    gib = needed / 2**30
    step = 10.0 ** (math.floor(math.log10(gib)) - 2)
    count = math.ceil(gib / step)
    while float(f"{count * step:.3g}") * 2**30 < needed:
        count += 1
    return f"{count * step:.3g}"


def ratio_meanings() -> str:
    """What each press's ratio is, as the presses declare it (`kv.axes.ratio_meaning`): the meaning most presses
    share, then each other one after the presses it belongs to, in listing order."""
    meanings: dict[str, list[str]] = {}
    for name, entry in PRESSES.entries().items():
        shown = PRESSES.listing_of(name) if registry.takes_argument(entry) else name
        meanings.setdefault(ratio_meaning(entry.facts), []).append(shown)
    common = max(meanings, key=lambda meaning: len(meanings[meaning]))
    return f"for most, {common}" + "".join(f"; for {', '.join(names)}, {meaning}"
                                           for meaning, names in meanings.items() if meaning != common)


def press_lines() -> list[tuple[str, str]]:
    """Every press as --help lists it, in listing order: its name as written (`adakv(<scorer>)`) and its declared
    summary, then the kvpress 0.5.5 class it equals (its declared `peer`) or that it is spectra's own."""
    rows = []
    for name, entry in PRESSES.entries().items():
        shown = PRESSES.listing_of(name) if registry.takes_argument(entry) else name
        peer = entry.facts.get("peer")
        source = f"kvpress: {peer}" if peer else "spectra's own"
        rows.append((shown, f"{entry.facts.get('summary', '')} ({source})"))
    return rows


#: the press facts each --local-layers mode refuses (`kv.locallayers` says why), each with its reason
LOCAL_REFUSED = {"decodes": "compresses while it decodes, which spectra's decoding does not do to a local layer",
                 "needs_rope": "reads rotary positions, which spectra knows for the global layers only (Gemma 3's "
                               "local layers rotate with a base of their own)",
                 "mixes": "keeps rows that are no context tokens, where a local layer's window reads positions",
                 WHOLE_MODEL: "runs a whole-model pass, which spectra runs with each local layer keeping its window "
                              "only",
                 "across_layers": "shares its budget among the global layers' heads, a local layer keeping its window"}


def local_refusal(mode: LocalLayers, presses: tuple[str, ...]) -> tuple[str, str] | None:
    """(press, why) for the first of `presses` whose effect on a local layer `mode` does not reproduce
    (`kv.locallayers`), or None: `compress` refuses every fact of `LOCAL_REFUSED`, `kvpress` all but `mixes` and
    every press that is no scorer (kvpress's row order is its ScorerPress')."""
    if mode == LocalLayers.KEEP:
        return None
    for press in presses:
        facts = PRESSES.facts(press)
        for fact, why in LOCAL_REFUSED.items():
            if facts.get(fact) and (fact != "mixes" or mode == LocalLayers.COMPRESS):
                return press, why
        if mode == LocalLayers.KVPRESS and not facts.get("scorer"):
            return press, ("is no scorer: kvpress's pipeline leaves a local layer's rows in its ScorerPress' order, "
                           "which spectra reproduces for scorers only")
    return None


@dataclass(frozen=True)
class PressOptions:
    """The presses compared, the ratios each compresses at, and how often a decoding press compresses."""

    presses: tuple[str, ...] = option(default_presses(), f"Comma-separated presses: {PRESSES.listing()} "
                                      "(<scorer>: "
                                      f"one of {', '.join(sorted(PRESSES.having('scorer')))}; <rowscorer>: one of "
                                      f"{', '.join(sorted(PRESSES.having('rowscorer')))}, the scorers reading only "
                                      "the cached rows; <decodable>: one of "
                                      f"{', '.join(sorted(PRESSES.having('decodable')))}, decoding(<decodable>) being "
                                      "kvpress's DecodingPress: the cache brought back to the ratio's size every "
                                      "--compression-interval decoding steps, nothing compressed after the prefill; "
                                      "<press>: a press named alone, composed(<press>,<press>,...) being kvpress's "
                                      "ComposedPress, each at the ratio in turn; "
                                      "<pattern>: a directory with DuoAttention's full_attention_heads.tsv and "
                                      "config.json, such as a `spectra heads` run; <run>: an analyze or heads run, "
                                      "<run>@rank to weigh heads by rank; <cache run>: a run with --bytes-kept; "
                                      "docs/cache.md explains each; kvpress:<name>: a configuration of kvpress's "
                                      "evaluation registry, kvpress:expected_attention being AdaKV around Expected "
                                      "Attention with epsilon 0.01; kvpress-leaderboard, or each of its loops' "
                                      "kvpress-leaderboard-question-free and kvpress-leaderboard-query-aware (to run "
                                      "with --query-aware): kvpress's leaderboard list). Default: every press named "
                                      "alone but those "
                                      f"running a whole-model pass of their own ({', '.join(EXTRA_PASSES)}); "
                                      f"{registry.ALL}: every press named alone.")
    ratios: tuple[float, ...] = option(DEFAULT_RATIOS, f"Comma-separated compression ratios in [0, 1), as each press "
                                       f"declares them: {ratio_meanings()}. The full cache (ratio 0) is always "
                                       "measured.")
    compression_interval: int = option(DEFAULT_INTERVAL, "Decoding steps between two compressions of a "
                                       "decoding(<decodable>) press (kvpress's compression_interval; the NLL protocol "
                                       "feeds the continuation one token a step).")
    local_layers: LocalLayers = option(LocalLayers.KEEP, "What a press does to a model's sliding-window (local) "
                                       "layers, Gemma 3's: keep (each keeps its window as the model does; the press "
                                       "compresses the global layers), compress (the press compresses each local "
                                       "layer's window too, at the same ratio), kvpress (as kvpress 0.5.5's pipeline "
                                       "does on Gemma3ForCausalLM: every layer compressed from the whole context, the "
                                       "window then counting cache rows; to compare with it). docs/cache.md says what "
                                       "each stores.")

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
        interval = self.compression_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise SpectraError(f"{spell('--compression-interval')} must be an integer ≥ 1, got {interval!r}")
        if interval != DEFAULT_INTERVAL and not self.decoding_presses:
            raise SpectraError(f"{spell('--compression-interval')} paces the decoding presses, but none is among "
                               f"{spell('--presses')}; add one (e.g. decoding(knorm)) or drop "
                               f"{spell('--compression-interval')}")
        object.__setattr__(self, "local_layers", choose(LocalLayers, self.local_layers, "--local-layers"))
        refused = local_refusal(self.local_layers, self.presses)
        if refused is not None:
            keep = spell("--local-layers keep", "local_layers='keep'")
            raise SpectraError(f"{spell('--local-layers', 'local_layers')} {self.local_layers}: {refused[0]} "
                               f"{refused[1]}; leave it out, or keep the local layers' windows ({keep})")
        for press in self.presses:  # a mixed plan plays its map's budgets only: refused here, not after the prefill
            parts = registry.applied(press)
            if parts is not None and parts[0] == "mixed":
                from ..kv.axes import check_plan_ratios

                check_plan_ratios(parts[1], self.ratios)

    @property
    def decoding_presses(self) -> tuple[str, ...]:
        """The chosen presses that compress while decoding (decoding(<decodable>))."""
        return tuple(press for press in self.presses if press in PRESSES.having("decodes"))

    @property
    def calibrating_presses(self) -> tuple[str, ...]:
        """The chosen presses that fit on calibration sequences."""
        return tuple(press for press in self.presses if press in PRESSES.having("calibrates"))


def check_patterns(options: PressOptions, layers: int | None, kv_heads: int | None, name: str,
                   heads: int | None = None, head_dim: int | None = None, hidden: int | None = None) -> None:
    """Refuse (one line) a `duo(DIR)` pattern, a `headbudget(DIR)` run or a `lukv(FILE)` budget curve that does not
    have the model's layers × key/value heads, or a learned artifact (`qfilter(DIR)`, `expected_attention_stats(DIR)`,
    `kvzap(DIR)`) of another shape (`head_dim`: known once the model has loaded; `hidden`: its hidden size D)."""
    from ..kv import artifacts, budgetcurve, headpattern
    from ..anatomy import headweights

    for parts in (part for press in options.presses for part in applied_within(press)):
        if parts[0] in artifacts.FORMATS:
            artifacts.fits(parts[0], parts[1], name, layers=layers, heads=heads, kv_heads=kv_heads,
                           head_dim=head_dim, hidden=hidden)
        if parts[0] == "duo":
            headpattern.fits(headpattern.read(parts[1]), layers, kv_heads, name, parts[1])
        if parts[0] == "headbudget":
            weights = headweights.read(parts[1])
            headpattern.fits(headpattern.HeadPattern(weights, 0, 0), layers, kv_heads, name, parts[1])
        if parts[0] == "lukv":
            budgetcurve.fits(budgetcurve.read(parts[1]), layers, kv_heads, name, parts[1])


def applied_within(press: str) -> list[tuple[str, str]]:
    """(name, argument) of `press` and of every press written inside it with an argument, outermost first: a
    configured name's expression (`kvpress:kvzap_mlp(DIR,-6)` → dms(kvzap(DIR),-6)), then `dms` and `kvzap(DIR)`."""
    found = PRESSES.configuration(press)
    parts = registry.applied(found[0] if found else press)
    return [] if parts is None else [parts, *(inner for part in split_top(parts[1]) for inner in applied_within(part))]


def rotary(config: dict[str, Any]) -> bool:
    """Whether a model's config says it uses rotary positions."""
    return any(config.get(name) for name in ROPE_FIELDS)


class PressStudy(Analysis):
    """A study of presses on a decoder's cache: the refusals every such study shares, before and after loading."""

    model_help = ("A decoder: Hugging Face hub id (HuggingFaceTB/SmolLM2-135M-Instruct), a local directory saved with "
                  "save_pretrained or a .gguf file; or a finished run directory, to print it again (and --plot it).")
    #: what the study does with the decoder, for the refusal of an encoder
    decodes: ClassVar[str] = "a key–value cache belongs to a decoder"

    def listings(self) -> dict[str, list[tuple[str, str]]]:
        return {"Presses": press_lines()}

    def meta(self, config: RunConfig, options: PressOptions, source) -> dict[str, Any]:
        """Also the sha256 of what the artifact presses read and of the data they were fitted on
        (`kv.provenance.artifacts`)."""
        from ..kv.provenance import artifacts

        return {**super().meta(config, options, source), "artifacts": artifacts(options.presses)}

    def check(self, config: RunConfig, options: PressOptions, shape: checkpoints.Shape) -> None:
        check_patterns(options, shape.layers, shape.kv_heads, shape.name, shape.heads, hidden=shape.hidden)
        if shape.causal is False:
            raise SpectraError(f"{shape.name} is an encoder: {self.decodes} (a causal language model, e.g. Llama, "
                               "Qwen2, SmolLM2)")
        self.check_local_layers(options, shape.windowed, shape.name)

    def check_local_layers(self, options: PressOptions, windowed: bool | None, name: str) -> None:
        """`--local-layers compress|kvpress` on a model without sliding-window layers (`windowed` False; None: its
        files do not tell, and the check waits for the loaded model), and on a model with them a press moving its
        kept keys to new positions (`renumbers`: a local layer keeps its window's, one position serving every layer),
        are refused."""
        if options.local_layers != LocalLayers.KEEP and windowed is False:
            raise SpectraError(f"{spell('--local-layers', 'local_layers')} {options.local_layers} compresses "
                               f"sliding-window layers, but {name} has none: drop the option (every layer is global)")
        moving = [press for press in options.presses if PRESSES.facts(press).get("renumbers")]
        if windowed and moving:
            rest = ",".join(press for press in options.presses if press not in moving)
            raise SpectraError(f"{', '.join(moving)} move{'s' * (len(moving) == 1)} kept keys to positions 0 … m − 1, "
                               f"which the sliding-window layers of {name} cannot follow (each keeps its window where "
                               f"it was): leave {'it' if len(moving) == 1 else 'them'} out on this model"
                               + (f" ({spell(f'--presses {rest}', f'presses={rest!r}')})" if rest else ""))

    def check_rope(self, options: PressOptions, uses_rope: bool | None, name: str) -> None:
        """Presses that read RoPE (rotary key channels, future positions, keys re-rotated): a model without it is
        refused."""
        channel = [press for press in options.presses if press in PRESSES.having("needs_rope")]
        if channel and uses_rope is False:
            raise SpectraError(f"{channel[0]} reads rotary positions, but {name} has no rotary position "
                               f"embedding (RoPE); choose presses among "
                               f"{', '.join(p for p in PRESSES if p not in PRESSES.having('needs_rope'))}")

    def check_files(self, config: RunConfig, options: PressOptions, found: checkpoints.Source) -> None:
        if found.local and found.gguf_file is None:
            self.check_rope(options, rotary(found.config), found.shape().name)

    def check_loaded(self, config: RunConfig, options: PressOptions, source) -> None:
        from .. import models, sliding

        loaded = source.loaded
        if loaded.head is None:
            raise SpectraError(f"{loaded.name} has no language-model head: spectra {self.name} scores next-token "
                               "predictions")
        self.check_rope(options, models.rotary(loaded.model), loaded.name)
        check_patterns(options, loaded.layers, loaded.kv_heads or loaded.heads, loaded.name, loaded.heads,
                       loaded.head_dim, getattr(getattr(loaded.model, "config", None), "hidden_size", None))
        self.check_windows(options, sliding.of_model(loaded.model), loaded.name)

    def check_windows(self, options: PressOptions, windows: list[int | None], name: str) -> None:
        """Once the model has loaded, on a model with sliding-window layers (`spectra.sliding`; each local layer
        keeping its window under `--local-layers keep`): a press whose whole-model pass does not follow them yet,
        `--local-layers` on a model without local layers, and under `compress` a press reading more last queries
        than a local layer holds (SnapKV's 64 in a window of W − 1 ≤ 64), each refused before any sequence."""
        self.check_local_layers(options, any(windows), name)
        if not any(windows):
            return
        passes = [press for press in options.presses if press in PRESSES.having(WHOLE_MODEL)
                  and unwindowed(PRESSES.facts(press).get("reads", ()))]
        if passes:
            what = f"the presses {', '.join(passes)}"
            raise SpectraError(f"{name} has sliding-window layers, which {what} does not follow yet: leave them out")
        held = min(window for window in windows if window is not None)
        if options.local_layers == LocalLayers.COMPRESS:
            reads = {press: PRESSES.facts(press).get("window") or WINDOW for press in options.presses
                     if press in PRESSES.having("windowed")}
            wide = [press for press, queries in reads.items() if queries >= held - 1]
            if wide:
                mode = spell("--local-layers compress", "local_layers='compress'")
                raise SpectraError(f"{wide[0]} reads the last {reads[wide[0]]} context queries, but under {mode} a "
                                   f"local layer of {name} holds {held - 1} tokens: leave {wide[0]} out")
