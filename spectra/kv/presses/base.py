"""What a press is: it turns one layer's exact prefill into the cache the continuation attends to.

A press (the word is NVIDIA kvpress's) acts once per layer, after an exact prefill of the L context tokens: it reads
what the prefill computed (`Prefill`: post-RoPE queries, keys and values, the attention of the last context queries,
the attention each key received, pre-RoPE keys and queries) and returns a `Compressed` cache per key/value head. The
continuation then attends to that cache (and to itself), with its original RoPE positions L, L+1, … (or m, m+1, …
where a press renumbers the kept tokens 0 … m − 1: `Compressed.start`, key_rerotation)

Two kinds of press fit the same interface:

- *eviction* presses keep n_kept of the L cached tokens per key/value head (`ScorerPress`: a score per token,
  the top n_kept kept, kvpress's `compute_n_kept`); `Compressed.kept` says which positions survived;
- *transform* presses return any rows (zeroed key channels, a low-rank or mixed-down K and V: Linformer's E·K,
  F·V); `kept` is None when the rows are not context tokens, and `saved` says what memory the press saves.

A new press is one module under `spectra/kv/presses/` and its test: a `Press` subclass decorated `@register`, whose
class body states its name and facts as literals (`name = "snapkv"`, `windowed = True`, its `summary`, its kvpress
`peer`, …; read from the source by `spectra.registry`, so `--help` lists them without torch). A press drawing randomly
seeds itself from `Prefill.seed` and `Prefill.index`. A press fitted on calibration sequences (`calibrates`) is made
fresh for the run (`fresh`), fitted on `--fit-samples` sequences' prefills (`calibrate`), keeps its statistics in the
checkpoint (`statistics`, `load_statistics`) and evaluates the later ones with its fit frozen (with none, it fits on
each context: an oracle). A `windowed` press (snapkv, loki) needs more than WINDOW context tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, TypeVar

import numpy as np
import torch

from ...kernels import window_rows
from ...registry import PRESSES, Registry
from ..passes import lacking
from .fields import configured, settings

#: the queries the prefill keeps for the presses: the last WINDOW context positions, the widest `window` a press
#: declares (SnapKV's 64, kvpress's window_size, in eviction.py), which every press declared `windowed` reads
WINDOW: int = PRESSES.most("window")


@dataclass(frozen=True, eq=False)
class Prefill:
    """One layer of one sequence's exact prefill of L context tokens: everything a press may read.

    Shapes: H query heads, H_kv key/value heads (query head h is key/value head h // (H / H_kv)'s: transformers'
    repeat_kv), L context tokens, d head dimensions.

    - `q` (H, w, d): post-RoPE queries of the last w = min(WINDOW, L) context positions;
    - `key`, `value` (H_kv, L, d): the cache as the prefill wrote it (keys post-RoPE);
    - `key_pre` (H_kv, L, d): the keys before RoPE (None for models without RoPE: then they equal `key`);
    - `window` (H, w, L): the causal attention of those w queries over the L context keys (P's last rows, summing to 1):
      `window_rows` where the prefill had them (a dense P), else computed from q and the keys when a press first
      reads them (SnapKV, TOVA), so a prefill for other presses skips them;
    - `scaling`: the score scale s of softmax(q kᵀ · s);
    - `seed`, `index`: the run's seed and the sequence's global index, for presses that draw randomly; `w_o` (D, H·d):
      the layer's output projection W^O (criticalkv's value norms; None where the model has none);
    - `rope`: positions (n,) → (cos, sin) (n, d); `question_tokens`: how many of the last context tokens are a
      query-aware record's question (FINCH's window); a local layer's `sliding_window` W (`spectra.sliding`; what a
      press does to it: `kv.locallayers`);
    - `passes`: what the prefill passes a run's presses read computed (`kv.passes`, `read`): `received` (H, L), Σ_i
      P_ij over the L context queries (a local layer's within its window); `query_pre` (H, L, d), the queries before RoPE; `hidden` (L, D), the attention
      input; the whole-model passes' scores of *every* layer (layers, H_kv, L), one tensor shared by the layers'
      records: `reconstruction` (KVzip's), `composition` (KVCompose's), `gradient` (KVgrad's).
    """

    layer: int
    q: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_pre: torch.Tensor | None
    window_rows: torch.Tensor | None
    scaling: float
    seed: int
    index: int
    w_o: torch.Tensor | None = None
    rope: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    question_tokens: int = 0
    sliding_window: int | None = None
    passes: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def read(self, name: str) -> torch.Tensor:
        """What the prefill pass `name` computed (`kv.passes.PASSES`); a press reads only those it declares."""
        if name not in self.passes:
            raise ValueError(lacking(name))
        return self.passes[name]

    @cached_property
    def window(self) -> torch.Tensor:
        return window_rows(self.q, self.key, self.scaling) if self.window_rows is None else self.window_rows

    @property
    def length(self) -> int:
        """L, the context tokens in the cache."""
        return self.key.shape[-2]

    @property
    def kv_heads(self) -> int:
        return self.key.shape[0]

    @property
    def groups(self) -> int:
        """Query heads per key/value head (G)."""
        return self.q.shape[0] // self.key.shape[0]

    @property
    def head_dim(self) -> int:
        return self.key.shape[-1]

    def group_mean(self, per_query_head: torch.Tensor) -> torch.Tensor:
        """(H, …) → (H_kv, …): the mean over the G query heads of each key/value head."""
        return per_query_head.unflatten(0, (self.kv_heads, self.groups)).mean(1)


@dataclass(frozen=True, eq=False)
class Compressed:
    """What the continuation attends to in place of one layer's L context tokens, per key/value head.

    `kept` (H_kv, m): the context position of each row, ascending, for presses whose rows are context tokens
    (eviction, ThinK) — None when they are not (a low-rank or mixed-down cache); `saved`: the share of the context
    cache's memory the press saves (1 − m/L for eviction; for ThinK half the pruned share of key channels, as
    kvpress reports it). `key`, `value` (H_kv, m, d): the rows, when they differ from the prefill's own keys and
    values at `kept` (None: those rows, gathered when needed, so an eviction press stores only its indices). Keys
    carry their RoPE rotation: a kept token keeps its original position.

    `valid` (H_kv, m) bool: which rows a head really keeps, for presses whose heads keep different numbers of tokens
    (AdaKV, DuoAttention: `per_head`). Each head's m_h kept positions come first, ascending, and its rows after them
    are padding (they repeat its last kept position) that every attention over the cache hides. None: every row is
    kept (the heads keep the same count), and the engine runs exactly as without it.

    `stored` (H_kv,): the bytes each key/value head's context cache really holds, for presses whose rows are not what
    they store (pruned channels, low-rank coefficients, quantized codes); None: its rows at the cache's dtype.

    `start`: the position of the continuation's first token where the press moved the kept keys to new positions
    (key_rerotation: m, its keys rotated to 0 … m − 1, as kvpress decodes after it); None: L, the original one.
    `window_positions` (H_kv, m): where a sliding-window layer's window reads its rows, if not at `kept` (`locallayers`).
    """

    kept: torch.Tensor | None
    saved: float
    key: torch.Tensor | None = None
    value: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    stored: torch.Tensor | None = None
    start: int | None = None
    window_positions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kept is None and (self.key is None or self.value is None):
            raise ValueError("a compressed cache whose rows are not context tokens must give its keys and values")
        if self.valid is not None and (self.kept is None or self.valid.shape != self.kept.shape):
            raise ValueError("per-head validity needs kept positions of the same shape")

    def counts(self) -> torch.Tensor:
        """(H_kv,) the rows each key/value head keeps (m_h; m for every head without `valid`)."""
        if self.valid is not None:
            return self.valid.sum(dim=-1)
        rows = self.key if self.kept is None else self.kept[..., None]
        return torch.full((rows.shape[0],), rows.shape[-2], dtype=torch.long, device=rows.device)

    def kept_mask(self, length: int) -> torch.Tensor:
        """(H_kv, L) bool: which of the L context positions each key/value head keeps (eviction presses)."""
        if self.kept is None:
            raise ValueError("a cache whose rows are not context tokens keeps no positions")
        hits = torch.zeros(self.kept.shape[0], length, dtype=torch.long, device=self.kept.device)
        weight = torch.ones_like(self.kept) if self.valid is None else self.valid.long()
        return hits.scatter_add_(1, self.kept, weight) > 0

    def rows(self, prefill_key: torch.Tensor, prefill_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) (H_kv, m, d), given the prefill's cached keys and values (H_kv, L, d)."""
        def gathered(cached: torch.Tensor) -> torch.Tensor:
            return cached.gather(1, self.kept[..., None].expand(-1, -1, cached.shape[-1]))

        return (self.key if self.key is not None else gathered(prefill_key),
                self.value if self.value is not None else gathered(prefill_value))

    def memory(self, prefill: Prefill) -> torch.Tensor:
        """(H_kv,) int64: the bytes of each key/value head's compressed context cache — `stored` when the press
        counted it, else its rows × (key + value dimensions) × the cache dtype's bytes (each head its own count; the
        kept positions are not stored: the keys carry their rotation)."""
        if self.stored is not None:
            return self.stored.to(torch.int64)
        return self.counts().to(torch.int64).cpu() * row_bytes(prefill)


def row_bytes(prefill: Prefill) -> int:
    """Bytes of one cached token of one key/value head at full precision: its key and its value."""
    return (prefill.key.shape[-1] + prefill.value.shape[-1]) * prefill.key.element_size()


def full_memory(prefill: Prefill) -> int:
    """Bytes of one key/value head's uncompressed context cache: L tokens × (key + value) at the cache's dtype."""
    return prefill.length * row_bytes(prefill)


def n_kept(length: int, ratio: float) -> int:
    """kvpress 0.5.5's `compute_n_kept`: the tokens kept when the fraction `ratio` of `length` is removed — the
    float product truncated (L = 100, r = 0.9 keeps 9: 100·0.1 = 9.999…), at least 1."""
    return 0 if ratio >= 1 else max(1, int(length * (1 - ratio)))


def evict(prefill: Prefill, scores: torch.Tensor, keep: int) -> Compressed:
    """Keep the `keep` highest-scoring context tokens of each key/value head (`scores` (H_kv, L), higher = keep),
    chosen by torch.topk as kvpress chooses them, listed in position order."""
    kept = torch.topk(scores, keep, dim=-1).indices.sort(dim=-1).values
    return Compressed(kept, 1.0 - keep / prefill.length)


def per_head(prefill: Prefill, keep: torch.Tensor) -> Compressed:
    """The cache keeping, per key/value head, the context positions where `keep` (H_kv, L) bool is true — as many
    as each head chose (at least one): rows padded to the largest head's count and marked by `Compressed.valid` (or
    no `valid` when every head keeps the same count). `saved`: the context rows dropped, 1 − Σ_h m_h / (H_kv·L)."""
    counts = keep.sum(dim=-1)
    if int(counts.min()) < 1:
        raise ValueError("every key/value head must keep at least one token")
    width = int(counts.max())
    positions = torch.arange(keep.shape[-1], device=keep.device).expand_as(keep)  # kept first, in order:
    order = torch.where(keep, positions, positions + keep.shape[-1]).sort(dim=-1).values[:, :width]
    valid = torch.arange(width, device=keep.device)[None] < counts[:, None]
    last = order.gather(1, (counts - 1)[:, None])
    kept = torch.where(valid, order, last)
    saved = 1.0 - float(counts.sum()) / keep.numel()
    return Compressed(kept, saved, valid=None if bool(valid.all()) else valid)


def full(prefill: Prefill) -> Compressed:
    """The uncompressed cache (ratio 0)."""
    return Compressed(torch.arange(prefill.length, device=prefill.key.device).expand(prefill.kv_heads, -1), 0.0)


class Press:
    """A compression of one layer's cache at a ratio (see the module docstring).

    Its class attributes are its declaration, literals in the class body that the registry reads from the source
    (those named in `registry.PRESSES`' facts). `name` is what `--presses` names; `needs_rope` refuses models without
    rotary positions before they load; `windowed` presses need more than WINDOW context tokens; `calibrates` presses
    fit on calibration sequences; `axis` is what the press removes, the axes whose losses `spectra cache` compares
    per head at equal bytes: `tokens` (rows along the sequence), `channels` (key channels), `rank` (principal
    directions), `bits`; its ratio is the share of that axis removed (`kv.axes.ratio_meaning`) unless `ratio_means`
    says otherwise."""

    name: ClassVar[str]
    #: name → keyword arguments, one registered instance each, for a class registered as several variants (kivi2/4/8)
    variants: ClassVar[dict[str, dict[str, object]]] = {}
    needs_rope, windowed, calibrates = False, False, False
    #: the prefill passes it reads (`kv.passes.PASSES`: "received", "query_pre", "reconstruction", …), which a prefill
    #: computes only when a run's press reads them; `min_context`: the fewest context tokens it compresses (compactor)
    reads: ClassVar[tuple[str, ...]] = ()
    min_context: ClassVar[int] = 0
    #: the kinds of scorer a wrapper takes: a `ScorerPress` (`adakv(<scorer>)`); `decodable`, one reading only the
    #: cached keys or the last query (`decoding(<decodable>)` applies it at each step); `rowscorer`, one reading only
    #: the cached rows and their order, so it scores any subset (`chunk(…)`, `block(…)`)
    scorer, decodable, rowscorer = False, False, False
    #: compresses while the answer or continuation is decoded, not once after the prefill (`decoding(<decodable>)`);
    #: `mixes`: its rows mix the context's tokens (linformer's E·K, F·V), which no press reads as tokens: it comes last;
    #: `across_layers`: one budget shared by every layer's heads (the global layers' where local ones keep a window);
    #: `renumbers`: it moves its kept keys to positions 0 … m − 1 (`Compressed.start`: finch, key_rerotation)
    decodes, mixes, across_layers, renumbers = False, False, False, False
    #: the last context queries it reads (SnapKV's window_size); 0: a `windowed` press reads the prefill's, WINDOW
    window: ClassVar[int] = 0
    #: reads a query-aware task record's question tokens as its window (`Prefill.question_tokens`: FINCH), so the
    #: question may hold no more than the WINDOW queries the prefill keeps (the task study refuses a longer one first)
    reads_question: ClassVar[bool] = False
    #: decoding steps between two compressions, for a press that `decodes` (kvpress's compression_interval)
    interval: int | None = None
    #: a press written `name(<argument>)`: the fact of the press it wraps (`adakv`: "scorer"; `number`: the number
    #: after it, `dms(<scorer>,<threshold>)`), or its text's (`duo`: "pattern") and the "module:function" checking it
    wraps, number, argument, check = "", "", "", ""
    #: a press written `name(a,b,…)`: the kinds of its arguments ("scorer,decodable"; "press,press…": two or more
    #: presses named alone), and the facts none of them may have (`registry.Registry.resolve`)
    several, refuses = "", ""
    #: one line for tables and --help: what the press keeps, a literal (`guide`: a wrapper's docs entry)
    summary, guide = "", ""
    #: the kvpress 0.5.5 class the press equals at its defaults (`SnapKVPress`; a wrapper: its own, `AdaKVPress`),
    #: or "" for spectra's own (loki, lowrank): every press class states it in its own body, as `--help` shows it
    peer: ClassVar[str] = ""
    #: what the press removes: tokens, channels, rank or bits (AXES)
    axis: ClassVar[str] = "tokens"
    #: what its ratio is, where it is not the share of its axis removed (duo: of heads; kivi: ignored)
    ratio_means: ClassVar[str] = ""
    #: its settings (its peer's keyword arguments) with their defaults, the attributes `fields.configured` sets
    fields: ClassVar[dict[str, object]] = {}

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        """The cache the continuation attends to, `ratio` ∈ (0, 1) of it removed (ratio 0 never reaches a press)."""
        raise NotImplementedError

    def target(self, context: int, ratio: float) -> int | None:
        """How the press acts while an answer or a continuation is decoded: the rows it keeps each layer's cache at
        (a press that `decodes`: `decoding(<decodable>)`), or None — it compresses once, after the prefill of
        `context` tokens, and decoding only appends to what it kept."""
        return None

    def fresh(self) -> Press:
        """A new instance with nothing fitted, for one run (the registry's instances are shared by every run)."""
        return configured(type(self)(), **settings(self))

    def for_run(self, **settings: object) -> Press:
        """This press as one run uses it: a fresh instance for one that `calibrates` (its fit is the run's), else
        the registry's. `settings` are the run's options a press may read (`compression_interval`, which
        `decoding(<scorer>)` overrides this to take; `layers`, the model's layer count, pyramidkv's); the others
        ignore them."""
        return self.fresh() if self.calibrates else self

    def calibrate(self, prefill: Prefill) -> None:
        """Add one calibration sequence's layer (presses that `calibrates`)."""
        raise NotImplementedError(f"{self.name} does not calibrate")

    def statistics(self) -> dict[str, np.ndarray]:
        """What the calibration has gathered, as float64 arrays (empty for a press that does not calibrate)."""
        return {}

    def load_statistics(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `statistics` returned (a resumed run)."""


class ScorerPress(Press):
    """kvpress's ScorerPress: one score per (key/value head, context token), the top n_kept kept per head."""

    scorer = True

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        """(H_kv, L) scores, higher = keep."""
        raise NotImplementedError

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        return evict(prefill, self.score(prefill, ratio), n_kept(prefill.length, ratio))


class Wrapper(Press):
    """A press applied to a scorer press, named `name(<scorer>)` on the command line (`adakv(snapkv)`; its file
    declares `{"wraps": "scorer"}`): the registry's `bind(inner)` makes the wrapped press, which takes the inner
    press's facts (windowed, calibrates, needs_rope) and hands it its calibration. The unbound instance (`inner` None)
    is what the file registers; it compresses nothing."""

    def __init__(self, inner: ScorerPress | None = None) -> None:
        self.inner = inner
        if inner is not None:
            self.name = f"{type(self).name}({inner.name})"  # type: ignore[misc]
            for flag in ("needs_rope", "windowed", "window", "calibrates", "reads", "min_context"):
                setattr(self, flag, getattr(inner, flag))

    def bind(self, inner: Press) -> Wrapper:
        """This press wrapping `inner` (a `ScorerPress`, as the registry's `wraps: "scorer"` checked)."""
        if not isinstance(inner, ScorerPress):
            raise TypeError(f"{self.name} wraps a scorer press, not {inner.name}")
        return type(self)(inner)

    def fresh(self) -> Press:
        return configured(type(self)(None if self.inner is None else self.inner.fresh()), **settings(self))

    def calibrate(self, prefill: Prefill) -> None:
        self.inner.calibrate(prefill)  # type: ignore[union-attr]

    def statistics(self) -> dict[str, np.ndarray]:
        return {} if self.inner is None else self.inner.statistics()

    def load_statistics(self, arrays: dict[str, np.ndarray]) -> None:
        if self.inner is not None:
            self.inner.load_statistics(arrays)

    def scores(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        """The inner press's (H_kv, L) scores (higher = keep)."""
        if self.inner is None:
            raise ValueError(f"{type(self).name} needs a scorer press: name it as {type(self).name}(<scorer>)")
        return self.inner.score(prefill, ratio)


#: press name → press, in the order of tables and legends, listed from the classes' source, imported on first use
REGISTRY: Registry[Press] = PRESSES

PressClass = TypeVar("PressClass", bound=type[Press])


def facts(press: Press) -> dict[str, object]:
    """What a press states about itself: `Press`' class attributes named as the registry's facts (flags checked before
    the model loads, what its argument is, the settings others read without torch: `window`, `interval`)."""
    return {name: getattr(press, name) for name in REGISTRY.fact_names}


def run_presses(names: Iterable[str], **settings: object) -> dict[str, Press]:
    """The presses `--presses` names, as one run uses them (`Press.for_run`, `settings`)."""
    return {name: REGISTRY[name].for_run(**settings) for name in names}


def register(cls: PressClass) -> PressClass:
    """Register a press class (a decorator): its instance under its `name`, or one per `variants` entry, built with
    its keyword arguments, under its name — with the facts the class declares. A variant's entry named as one of the
    registry's facts is no argument but that fact's declaration for the variant (kivi2's `summary`), which its
    instance must state itself (`Registry.add` checks that they agree)."""
    for name, entries in (vars(cls).get("variants") or {cls.name: {}}).items():
        press = cls(**{key: value for key, value in entries.items() if key not in REGISTRY.fact_names})
        if press.name != name:
            raise ValueError(f"{cls.__name__} declares the press '{name}', but its instance is named '{press.name}'")
        REGISTRY.add(name, press, **facts(press))
    return cls
