"""A cell: one (press, ratio) on one prefilled example — the compressed cache it yields, how much of the context it
keeps, what it stores, whether it kept the needle, and how it decodes.

Both protocols of `spectra cache` measure the same grid: the full cache (press 'full', ratio 0) and every press of
`--presses` at every ratio of `--ratios`, on one exact prefill per example. `Cells` is that grid, made once per run:
its (press, ratio) `variants`, in table order, and the run's own presses (`presses.run_presses`: a calibrating press's
fit is the run's). `Cells.of(context, seed, index)` hands out one `Cell` per variant for an example; the probes feed it
the example's prefill layer by layer (`Cell.compress`) and read off it what their tables record:

- `parts`: the compressed cache of every layer (`presses.Compressed`), `buffers(prefills, room)` laid out for decoding;
- `counts(layer)` / `counts()`: the context rows each key/value head keeps, and `kept_share()` those over the context;
- `memory(layer)`, `bytes()`, `full_bytes()`: the bytes of the compressed context cache per key/value head and in
  all, beside the full cache's;
- `survival(needle)`: per layer and key/value head, the share of the needle's positions the cache kept;
- `start`: the position the question (or continuation) starts at — the context's length L, or m where the press moved
  its kept keys to positions 0 … m − 1 (`Compressed.start`: key_rerotation, as kvpress's pipeline decodes after it);
- `recompression()`: how it decodes — None for a press that compresses once, after the prefill, else the
  `generation.Recompression` that brings the cache back to the press's size (its `target` rows, or a share of the
  tokens seen: `compression_ratio_decoding`) while an answer or continuation is decoded.

A press that acts while decoding says so itself (`Press.target` is not None: `decoding(<decodable>)` and its kin):
after the prefill it leaves the cache whole (or, `prefill_decoding`, evicted to its target), and its rows are no
longer context positions once decoding compresses; its kept share and bytes are then its target's (the eviction
press at that ratio stores as much) and its needle survival is undefined (NaN). Nothing here asks what type a press
is. A sliding-window layer's cache, and the bytes it stores uncompressed, are `--local-layers`' (`kv.locallayers`).

The cell sits beside the engine (`prefill`, `kvcache`, `decoding`), not in `presses/`: it joins a press to the
decoding engine (its `Recompression` and `Buffers`), which itself imports the presses; the two probes (`probes.cache`,
`probes.tasks`) sit above it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..config import LocalLayers
from ..errors import SpectraError
from . import generation, locallayers
from .presses import Compressed, Prefill, Press, full, run_presses
from .presses.base import full_memory, row_bytes
from .tasks import needle as needles

#: the name of the full cache's cell (ratio 0), first in every table
FULL = "full"


def start(parts: Sequence[Compressed], context: int) -> int:
    """The position the continuation's first token takes after the caches `parts` (one per layer) of a `context`-token
    prefill: the press's `Compressed.start` where it renumbered the kept tokens (one for every layer), else `context`."""
    starts = {part.start for part in parts}
    if len(starts) > 1:
        raise SpectraError("the press renumbers the kept tokens of the global layers (key_rerotation), which a model's "
                           "sliding-window layers cannot follow: leave it out on this model")
    found = starts.pop() if starts else None
    return context if found is None else found


class Cell:
    """`press` (its name; `FULL` for the full cache, `compressor` None) at `ratio` on one example of `context` tokens,
    the run's `seed` and the example's global `index` (what a scorer drawing at random or decoding reads);
    `local_layers`: what the press does to a sliding-window layer (`kv.locallayers`). Fed the example's prefill one
    layer at a time, in order (`compress`)."""

    def __init__(self, press: str, ratio: float, compressor: Press | None, context: int, seed: int,
                 index: int, local_layers: LocalLayers = LocalLayers.KEEP) -> None:
        self.press, self.ratio, self.compressor = press, ratio, compressor
        self.context, self.seed, self.index, self.local_layers = context, seed, index, local_layers
        #: the rows each layer's cache is kept at while decoding, or None (see the module docstring)
        self.target = None if compressor is None else compressor.target(context, ratio)
        self.parts: list[Compressed] = []
        self._counts: list[np.ndarray] = []
        self._memory: list[torch.Tensor] = []
        self._whole: list[int] = []

    @property
    def start(self) -> int:
        """The position of the question's (or continuation's) first token after this cell's cache (`start`)."""
        return start(self.parts, self.context)

    @property
    def decodes(self) -> bool:
        """Whether the cell's press compresses while decoding (its cache after the prefill is the whole one)."""
        return self.target is not None

    def compress(self, prefill: Prefill) -> Compressed:
        """The next layer's compressed cache (the full cache's for `FULL`), recorded with its counts and bytes."""
        if prefill.layer != len(self.parts):
            raise ValueError(f"layer {prefill.layer} reached the cell after {len(self.parts)} layers: feed them in order")
        windowed = prefill.sliding_window is not None
        if windowed:
            part = locallayers.compressed(prefill, self.compressor, self.ratio, self.local_layers)
        else:
            part = full(prefill) if self.compressor is None else self.compressor.compress(prefill, self.ratio)
        self.parts.append(part)
        if self.target is None or windowed:
            self._counts.append(part.counts().double().cpu().numpy())
            self._memory.append(part.memory(prefill))
        else:  # the rows it brings the cache back to while decoding, at full precision
            self._counts.append(np.full(prefill.kv_heads, float(self.target)))
            self._memory.append(torch.full((prefill.kv_heads,), self.target * row_bytes(prefill), dtype=torch.int64))
        # what the layer really stores uncompressed: a local layer its window (kvpress's cache: the whole context)
        self._whole.append(locallayers.whole(prefill, self.local_layers) if windowed
                           else full_memory(prefill) * prefill.kv_heads)
        return part

    def counts(self, layer: int | None = None) -> np.ndarray:
        """The context rows each key/value head keeps, float64: (H_kv,) of one layer, or (layers, H_kv)."""
        return self._counts[layer] if layer is not None else np.stack(self._counts)

    def kept_share(self) -> np.ndarray:
        """(layers, H_kv): the share of the context's rows each key/value head keeps."""
        return self.counts() / self.context

    def memory(self, layer: int) -> torch.Tensor:
        """(H_kv,) int64: the bytes of each key/value head's compressed context cache in `layer`."""
        return self._memory[layer]

    def bytes(self) -> int:
        """The bytes of the compressed context cache, over every layer and key/value head."""
        return sum(int(memory.sum()) for memory in self._memory)

    def whole(self, layer: int) -> int:
        """The bytes `layer` stores uncompressed, over its key/value heads: a local layer's `locallayers.whole`."""
        return self._whole[layer]

    def full_bytes(self) -> int:
        """The bytes of the full context cache, over every layer and key/value head."""
        return sum(self._whole)

    def saved(self) -> float:
        """The mean over layers of the share of memory the press reports saving (`Compressed.saved`)."""
        return float(np.mean([part.saved for part in self.parts]))

    def survival(self, needle: np.ndarray) -> np.ndarray:
        """(layers, H_kv): the share of the `needle`'s context positions each key/value head kept (`needle.survival`);
        NaN where the rows are not context positions (a transform, or a press that compresses while decoding)."""
        rows = [np.full(len(counts), np.nan) if part.kept is None or self.decodes else
                needles.survival(part.kept.cpu().numpy(), needle, self.context)
                for part, counts in zip(self.parts, self._counts)]
        return np.stack(rows)

    def buffers(self, prefills: Sequence[Prefill], room: int) -> generation.Buffers:
        """Every layer's compressed cache laid out for decoding, with `room` rows to spare per layer; `prefills` are
        the example's (eviction presses gather their rows from them)."""
        return generation.Buffers.of(self.parts, prefills, room)

    def recompression(self) -> generation.Recompression | None:
        """How the cell decodes: None (decoding appends to the cache the press left), or the recompression of a press that
        keeps the cache at its `target` rows while generation."""
        if self.target is None:
            return None
        return generation.Recompression(self.compressor, self.target, self.seed, self.index, self.ratio)


class Cells:
    """The (press, ratio) grid of a run: the full cache first, then each of `presses` at each of `ratios`, with the
    run's own presses built once (`presses.run_presses`, given the run's `settings`: `compression_interval`, and
    `layers`, the model's layer count, which a press budgeting per layer reads — pyramidkv), each cell doing
    `local_layers` to a sliding-window layer."""

    def __init__(self, presses: Sequence[str], ratios: Sequence[float],
                 local_layers: LocalLayers = LocalLayers.KEEP, **settings: object) -> None:
        self.local_layers = local_layers
        self.presses: dict[str, Press] = run_presses(presses, **settings)
        self.variants: list[tuple[str, float]] = [(FULL, 0.0)] + [(press, ratio) for press in presses
                                                                  for ratio in ratios]

    def __len__(self) -> int:
        return len(self.variants)

    def __iter__(self) -> Iterator[tuple[str, float]]:
        return iter(self.variants)

    def of(self, context: int, seed: int, index: int) -> Iterator[Cell]:
        """One fresh cell per variant, in order, for an example of `context` tokens (global index `index`): made as
        they are asked for, so a caller that drops each cell before the next holds one compressed cache at a time."""
        for press, ratio in self.variants:
            yield Cell(press, ratio, None if press == FULL else self.presses[press], context, seed, index,
                       self.local_layers)
