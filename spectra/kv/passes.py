"""What a prefill computes for the presses beyond the cache, declared once: the prefill passes.

Every layer's `presses.Prefill` carries the cache (keys, values, keys before RoPE), the last WINDOW context queries,
their attention rows (formed when first read), the scale, W^O and RoPE. The rest costs memory or whole forward passes,
so a prefill computes it only when a run's press reads it: a press declares `reads = ("received",)` in its class (a
literal the registry reads from the source), and `Prefill.read("received")` hands it what the pass computed. Each
`Pass` says what it fills (`Prefill.read(name)`), the function computing it ("module:function", imported when it
runs), whether it is a *whole-model* pass — run once after the prefill's forward pass, for every layer at once: KVzip's
reconstruction, KVCompose's replay, KVgrad's attribution, each costing a few prefills — or a *layer* pass computed
inside the forward pass from what the layer's attention sees (`Seen`), and what it needs.

Everything that asks what a run's presses read loops over `PASSES`: the engine (`kv.prefill.exact` and `scored`), the
NLL probe (`probes.cache`), the task source's memory estimate, a chain of presses (`composed` hands on the passes
that are `chained`), the registry (a press reading a pass holds the pass's name as a fact, and `whole_model` if it
is one: `composed` refuses them, `spectra cache` leaves them out by default, mixed plans refuse presses reading any)
and `--help`. A press needing a new pass is its file, the pass's entry here, its function and their tests.

Torch-free at import (the registry reads it before anything loads).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Pass:
    """One thing a prefill can compute for the presses: `name`, what a press's `reads` names and `Prefill.read`
    returns; `what` it is, in words; `compute`, its function ("module:function"): of a layer pass, `f(seen: Seen)`
    (None: nothing for this layer); of a whole-model pass, `f(*needs)`, the `WholeModel` attributes `needs` names;
    `needs`, of a layer pass what it reads beyond the layer's q, k, v — "attention" (the layer's causal attention,
    within its window on a sliding-window layer), "q" (the query projection's output), "input" (the attention input) —;
    `per_token`, the dimensions a layer's result holds per context token (`heads`, `head_dim`, `hidden`; () where
    it is small beside the window's rows), for the memory estimate; `chained`, whether a chain of presses hands it on
    to its next press unchanged (`composed`: the whole context's, as kvpress's hooks read the forward pass); `tokens`,
    the dimension of a layer's result indexed by context token (a local layer's part of it: `kv.locallayers.held`);
    `windows`, whether a whole-model pass follows a model's sliding-window layers (their attention within the window:
    a press reading one that does not is refused on such a model)."""

    name: str
    what: str
    compute: str
    whole_model: bool = False
    needs: tuple[str, ...] = ()
    per_token: tuple[str, ...] = ()
    chained: bool = False
    tokens: int = -1
    windows: bool = False

    def function(self) -> Callable[..., Any]:
        module, name = self.compute.split(":")
        return getattr(importlib.import_module(module), name)


#: every prefill pass, in the order the engine runs them
PASSES: dict[str, Pass] = {found.name: found for found in (
    Pass("received", "the attention each key received", "spectra.kv.prefill:received", needs=("attention",)),
    Pass("query_pre", "the context's queries before RoPE", "spectra.kv.passes:query_pre", needs=("q",),
         per_token=("heads", "head_dim"), chained=True, tokens=-2),
    Pass("hidden", "each layer's attention input", "spectra.kv.passes:hidden", needs=("input",),
         per_token=("hidden",), tokens=-2),
    Pass("reconstruction", "KVzip's reconstruction pass", "spectra.kv.reconstruction:scores", whole_model=True,
         needs=("model", "layers", "keys", "values", "ids", "repetition", "index"), windows=True),
    Pass("composition", "KVCompose's replay pass", "spectra.kv.composition:scores", whole_model=True,
         needs=("model", "layers", "ids", "index"), windows=True),
    Pass("gradient", "KVgrad's gradient pass", "spectra.kv.gradient:scores", whole_model=True,
         needs=("model", "layers", "keys", "values", "ids", "repetition", "index"), windows=True),
)}
#: the fact a press reading a whole-model pass holds (`held`)
WHOLE_MODEL = "whole_model"


@dataclass
class Seen:
    """What a layer pass reads of one layer of one sequence's prefill: `q` (H, L, d) post-RoPE, `key`, `value`
    (H_kv, L, d), `scaling`; `hooked`, the layer's hooked outputs a pass needs ("q": the query projection (L, H·d),
    "input": the attention input (L, D)); `p` (H, L, L), the dense attention where the forward pass formed it (the NLL
    protocol); `fused`, `chunk_bytes`: how the received attention is computed without it. `output`: the layer's
    attention output (1, H, L, d) where a pass computed it on the way (the fused kernel), which the engine uses.
    `window`: a sliding-window layer's W, each query attending its last W keys (`spectra.sliding`), else None."""

    q: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float
    hooked: Mapping[str, torch.Tensor] = field(default_factory=dict)
    p: torch.Tensor | None = None
    fused: bool = True
    chunk_bytes: int = 2**27
    output: torch.Tensor | None = None
    window: int | None = None


@dataclass(frozen=True)
class WholeModel:
    """What a whole-model pass reads: the model and its layer count, every layer's prefill, the context `ids` (L,),
    the example's global `index` and the tokenizer's repetition prompts (`repetition`, for the passes needing it)."""

    model: Any
    layers: int
    prefills: Sequence[Any]  # each layer's `presses.Prefill`
    ids: torch.Tensor
    index: int
    repetition: Any = None  # `reconstruction.Repetition`

    @property
    def keys(self) -> list[torch.Tensor]:
        return [part.key for part in self.prefills]

    @property
    def values(self) -> list[torch.Tensor]:
        return [part.value for part in self.prefills]


def read_by(presses: Iterable[str]) -> tuple[str, ...]:
    """The passes the presses named `presses` (registry names, as `--presses` gives them) read, in `PASSES`' order."""
    from ..registry import PRESSES

    named = [PRESSES.facts(name) for name in presses]
    return tuple(name for name in PASSES if any(name in facts.get("reads", ()) for facts in named))


def layer_passes(reads: Iterable[str]) -> list[Pass]:
    """The layer passes among the names `reads`, in `PASSES`' order (the order the engine runs them)."""
    named = set(reads)
    return [entry for entry in PASSES.values() if entry.name in named and not entry.whole_model]


def whole_model_passes(reads: Iterable[str]) -> list[Pass]:
    """The whole-model passes among the names `reads`, in `PASSES`' order."""
    named = set(reads)
    return [entry for entry in PASSES.values() if entry.name in named and entry.whole_model]


def unwindowed(reads: Iterable[str]) -> list[str]:
    """The whole-model passes among `reads` that do not follow sliding-window layers."""
    return [entry.name for entry in whole_model_passes(reads) if not entry.windows]


def needed(reads: Iterable[str], need: str) -> bool:
    """Whether a pass of `reads` needs `need` ("q", "input", "attention", "repetition", …)."""
    return any(need in PASSES[name].needs for name in reads)


def computed(reads: Iterable[str], seen: Seen) -> dict[str, torch.Tensor]:
    """The layer passes of `reads` on one layer (`seen`; a sliding-window layer's attention within its window)."""
    found = {}
    for entry in layer_passes(reads):
        if (value := entry.function()(seen)) is not None:
            found[entry.name] = value
    return found


def scored(reads: Iterable[str], run: WholeModel) -> dict[str, torch.Tensor]:
    """The whole-model passes of `reads`, each run once for every layer: name → (layers, H_kv, L) scores."""
    return {entry.name: entry.function()(*(getattr(run, need) for need in entry.needs))
            for entry in whole_model_passes(reads)}


def query_pre(seen: Seen) -> torch.Tensor | None:
    """(H, L, d): the context's queries before RoPE, from the query projection's output (L, H·d)."""
    found = seen.hooked.get("q")
    return None if found is None else found.unflatten(-1, (seen.q.shape[0], -1)).transpose(0, 1)


def hidden(seen: Seen) -> torch.Tensor | None:
    """(L, D): the layer's attention input."""
    return seen.hooked.get("input")


def held(facts: Mapping[str, Any]) -> dict[str, bool]:
    """The facts a press holds because of the passes it reads (`reads`): each pass's name, and `WHOLE_MODEL` where
    one is a whole-model pass — what `composed` refuses and the default presses leave out (`registry.Registry`'s
    `derive`)."""
    reads = [PASSES[name] for name in facts.get("reads", ()) if name in PASSES]
    unknown = [name for name in facts.get("reads", ()) if name not in PASSES]
    if unknown:
        raise ValueError(f"a press reads the unknown prefill pass {', '.join(unknown)}; the passes: "
                         f"{', '.join(PASSES)} (spectra/kv/passes.py)")
    return {**{entry.name: True for entry in reads}, **({WHOLE_MODEL: True} if any(e.whole_model for e in reads)
                                                        else {})}


#: what a press reading each pass does, as a refusal says it (`arguments.either`)
SAID = {**{name: f"reads {entry.what}" for name, entry in PASSES.items()},
        WHOLE_MODEL: "runs a whole-model pass of its own (" + ", ".join(
            entry.what for entry in PASSES.values() if entry.whole_model) + ")"}


def lacking(name: str) -> str:
    """Why a prefill has no `name`: the line a press reading an undeclared pass fails with."""
    what = PASSES[name].what if name in PASSES else "an unknown pass"
    return (f"this prefill lacks '{name}' ({what}): the engine computes it only for a press declaring "
            f"reads = (\"{name}\",) (spectra/kv/passes.py)")
