"""Greedy decoding from a compressed cache, as kvpress 0.5.5's `KVPressTextGenerationPipeline` decodes.

After one exact prefill of the context (`spectra.kv.prefill`), a press leaves each layer's cache as rows of keys and
values per key/value head (`presses.Compressed`). `Buffers.of` lays every layer's rows into a buffer with room for the
question and the answer; `greedy_alone` then runs the question (question + the chat template's generation suffix + the
answer prefix) through the model in one forward pass at positions L … L + n − 1 — L the *original* context length,
whatever the press kept, as kvpress passes `position_ids` — and decodes greedily one token at a time at the
positions after it, up to `max_new_tokens`, stopping after a stop token (the model's EOS) produced by a decoding
step. kvpress's order is kept to the letter: the question's forward pass gives the first token, which is never
checked against the stop tokens; each of the next max_new_tokens − 1 steps feeds the last token and stops once the
new one is a stop token (kept: decoding drops special tokens).

Each layer's attention in those passes is `scaled_dot_product_attention` of the new queries over the layer's cached
rows and the new tokens so far (causal among the new ones), the call kvpress's SDPA model makes; new keys and values
are written into the buffer, never concatenated, so a step costs O(cache) reads and no copy. A cache (one press at one
ratio) decodes on its own, so its answer never depends on what else runs beside it. On a CPU decoding runs on one
intra-op thread (`THREADS`): its operations are small, and the fork-join of more threads costs more than they save (a
one-token SDPA over 1k cached keys of SmolLM2: 0.3 ms on one thread, 20 ms on two cores shared with other work).

With `needle` positions, the question's pass also measures, per layer and query head, the attention mass its queries
put on those context positions (the softmax over every cached row and the question's own keys, eager's operations),
averaged over the question's queries: on the full cache, where row j is context position j, that is how much the
model looks at the answer's tokens when asked (`spectra.probes.tasks`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .. import capture, sliding
from ..capture import Captured
from ..kernels import causal_mask, eager_softmax
from .presses import Compressed, Prefill
from .presses.cam import accumulate
from .presses.decoding import DecodingPress


#: intra-op threads of decoding on a CPU
THREADS = 1


@contextlib.contextmanager
def threads(device: torch.device, count: int = THREADS) -> Iterator[None]:
    """Within the block, torch runs `count` intra-op threads when `device` is a CPU (restored after)."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(min(count, before))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Buffers:
    """Every layer's cache for decoding: `keys[ℓ]`, `values[ℓ]` (H_kv, capacity, d) buffers whose first
    `lengths[ℓ]` rows are filled (the compressed context, then the tokens decoded so far); `valid[ℓ]` (H_kv,
    capacity) marks the rows each key/value head attends to when its heads keep different numbers of context tokens
    (`Compressed.valid`; the padding rows are hidden), None when every row is seen."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: list[int]
    valid: list[torch.Tensor | None] = field(default_factory=list)
    #: per layer, its sliding window (None: global) and, for a local layer, each row's position per key/value head
    #: (H_kv, capacity): where its window reads the row (`Compressed.window_positions`, else `kept`)
    windows: list[int | None] = field(default_factory=list)
    positions: list[torch.Tensor | None] = field(default_factory=list)
    #: the positions (n,) of the tokens of the pass under way (the decoding loop sets them before each pass)
    at: torch.Tensor | None = None

    @classmethod
    def of(cls, parts: Sequence[Compressed], prefills: Sequence[Prefill], room: int) -> Buffers:
        """The caches `parts` (one per layer) leave of the `prefills`, with `room` rows to spare per layer."""
        keys, values, lengths, valid, windows, positions = [], [], [], [], [], []
        for part, prefilled in zip(parts, prefills):
            key, value = part.rows(prefilled.key, prefilled.value)
            kept = key.shape[-2]
            key_buffer = key.new_empty(key.shape[0], kept + room, key.shape[-1])
            value_buffer = value.new_empty(value.shape[0], kept + room, value.shape[-1])
            key_buffer[:, :kept], value_buffer[:, :kept] = key, value
            keys.append(key_buffer)
            values.append(value_buffer)
            lengths.append(kept)
            mask = None
            if part.valid is not None:
                mask = torch.ones(key.shape[0], kept + room, dtype=torch.bool, device=key.device)
                mask[:, :kept] = part.valid
            valid.append(mask)
            windows.append(prefilled.sliding_window)
            where = None
            if prefilled.sliding_window is not None:
                at = part.kept if part.window_positions is None else part.window_positions
                if at is None:
                    raise ValueError("a sliding-window layer's cache must hold context positions")
                where = torch.zeros(key.shape[0], kept + room, dtype=torch.long, device=key.device)
                where[:, :kept] = at
            positions.append(where)
        return cls(keys, values, lengths, valid, windows, positions)

    def local(self, layer: int) -> bool:
        """Whether `layer` attends through a sliding window (its rows carry positions)."""
        return bool(self.windows) and self.windows[layer] is not None

    def shown(self, layer: int) -> torch.Tensor | None:
        """(H_kv, n, filled rows) bool: what the pass's n queries see of a local layer's rows (its window of
        positions, per key/value head), None for a global layer (every earlier row, the new ones causally)."""
        if not self.local(layer):
            return None
        return sliding.band(self.at, self.positions[layer][:, :self.lengths[layer]], self.windows[layer])

    def seen(self, layer: int) -> torch.Tensor | None:
        """(H_kv, filled rows) bool: the rows of the layer each key/value head attends to (None: all of them)."""
        mask = self.valid[layer] if self.valid else None
        return None if mask is None else mask[:, :self.lengths[layer]]

    def extend(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write n new keys and values (H_kv, n, d) after the layer's rows; returns the filled rows."""
        start, count = self.lengths[layer], key.shape[-2]
        if start + count > self.keys[layer].shape[-2]:
            raise ValueError(f"layer {layer}'s cache holds {self.keys[layer].shape[-2]} rows; {start + count} asked")
        self.keys[layer][:, start:start + count] = key
        self.values[layer][:, start:start + count] = value
        if self.local(layer):
            self.positions[layer][:, start:start + count] = self.at
        self.lengths[layer] = start + count
        return self.keys[layer][:, :start + count], self.values[layer][:, :start + count]

    def rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's filled rows (H_kv, M, d): views of its buffers."""
        filled = self.lengths[layer]
        return self.keys[layer][:, :filled], self.values[layer][:, :filled]

    def keep(self, layer: int, kept: torch.Tensor, values: torch.Tensor | None = None) -> None:
        """Keep rows `kept` (H_kv, m) of the layer's filled rows, in that order, as its first m rows (a compression
        while decoding rewrites the buffer: no new one); `values` (H_kv, m, d): their values when the press changed
        them (cam's merges), else their own."""
        key, value = self.rows(layer)
        index = kept[..., None].expand(-1, -1, key.shape[-1])
        count = kept.shape[-1]
        self.keys[layer][:, :count] = key.gather(1, index)
        self.values[layer][:, :count] = value.gather(1, index) if values is None else values
        seen = self.seen(layer)
        if seen is not None:
            self.valid[layer][:, :count] = seen.gather(1, kept)
        self.lengths[layer] = count


@dataclass
class Recompression:
    """A `DecodingPress` at work on one cache (`presses.decoding`): per layer, the decoding steps since its last
    compression; after a step's attention in a layer, `after` compresses that layer's cache to `size()` rows when
    the press says it is due. `target`, `ratio`: the cell's (the press sizes each compression from them and `seen`,
    the tokens seen so far — the pass's last logical position + 1, which the decoding loop sets before each pass).
    `seed`, `index`: the run's seed and the example's global index (for the scorer). A press that `merges` (cam)
    also has, per layer, the running sum of each step's attention over the cache (`attention`) and draws from one
    generator per cache, seeded `press.seed_of(seed, index)`."""

    press: DecodingPress
    target: int
    seed: int = 0
    index: int = 0
    ratio: float = 0.0
    steps: dict[int, int] = field(default_factory=dict)
    compressions: int = 0
    seen: int = 0
    attention: dict[int, torch.Tensor] = field(default_factory=dict)
    generator: torch.Generator | None = None
    first: int | None = None  # the first layer the press compresses (where compressions are counted)

    def size(self, seen: int | None = None) -> int:
        """The rows a compression keeps once `seen` tokens have been seen (default: the current pass's)."""
        return self.press.size(self.target, self.seen if seen is None else seen, self.ratio)

    def after(self, layer: int, cache: Buffers, q: torch.Tensor, scaling: float, steps: int = 1) -> None:
        """Layer `layer` has attended with queries q (H, n, d) (its new rows written): `steps` decoding steps more
        (a teacher-forced pass of n tokens is n steps; a generation step is one, the question's pass too)."""
        if cache.local(layer):  # a sliding-window layer keeps its window, not the press's size
            return
        self.first = layer if self.first is None else self.first
        self.steps[layer] = self.steps.get(layer, 0) + steps
        step_tokens = 1 if steps > 1 else q.shape[-2]
        merges = getattr(self.press, "merges", False)
        if merges:
            self.attention[layer] = accumulate(self.attention.get(layer), q, cache.rows(layer)[0], scaling, steps > 1)
        target = self.size()
        if not self.press.due(self.steps[layer], step_tokens, target):
            return
        key, value = cache.rows(layer)
        if merges:
            self.merge(layer, q, key, value, scaling, target, cache)
        else:
            kept = self.press.keep(layer, q, key, value, scaling, target, self.seed, self.index)
            if kept is not None:
                cache.keep(layer, kept)
                self.compressions += layer == self.first
        self.steps[layer] = 0

    def merge(self, layer: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, target: int,
              cache: Buffers) -> None:
        """A merging press's compression of the layer (`after`'s arguments): kept rows, merged values, the running
        attention pruned with them."""
        if self.generator is None:
            self.generator = torch.Generator(device=q.device)
            self.generator.manual_seed(self.press.seed_of(self.seed, self.index))  # type: ignore[attr-defined]
        merged = self.press.merge_keep(layer, q, key, value, scaling, target,  # type: ignore[attr-defined]
                                       self.attention[layer], self.steps[layer], self.generator, self.seed, self.index)
        if merged is not None:
            kept, values, self.attention[layer] = merged
            cache.keep(layer, kept, values)
            self.compressions += layer == self.first


@dataclass
class Decoded:
    """A greedy answer: its token ids and, when asked, the question's attention on the needle (layers, H)."""

    ids: list[int]
    needle_mass: torch.Tensor | None = None


def decode_attention(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                     seen: torch.Tensor | None = None, shown: torch.Tensor | None = None) -> torch.Tensor:
    """n new queries q (H, n, d) over M rows key, value (H_kv, M, d) whose last n are the queries' own tokens: every
    earlier row is seen (or, with `seen` (H_kv, M) bool, the rows each key/value head keeps), the new tokens
    causally (or, with `shown` (H_kv, n, M) bool, what each query sees: a sliding window's rows). Returns (H, n, d)."""
    n, rows = q.shape[-2], key.shape[-2]
    groups = q.shape[0] // key.shape[0]
    mask = (shown.repeat_interleave(groups, dim=0) if shown is not None else None if n == 1
            else causal_mask(n, rows, q.device))
    if seen is not None:
        per_head = seen.repeat_interleave(groups, dim=0)[:, None, :]  # (H, 1, M)
        mask = per_head if mask is None else per_head & mask
    return torch.nn.functional.scaled_dot_product_attention(q[None], key[None], value[None], attn_mask=mask,
                                                            scale=scaling, enable_gqa=q.shape[0] != key.shape[0])[0]


def needle_mass(q: torch.Tensor, key: torch.Tensor, scaling: float, needle: torch.Tensor,
                shown: torch.Tensor | None = None) -> torch.Tensor:
    """The mean over the n queries q (H, n, d) of their attention on rows `needle` of key (H_kv, M, d) (the last n
    rows are their own, seen causally; or `shown` (n, M) bool, what each query sees: a sliding window's): (H,)."""
    heads, n, dim = q.shape
    kv_heads, rows = key.shape[0], key.shape[-2]
    scores = torch.matmul(q.reshape(kv_heads, -1, dim), key.transpose(-1, -2)).view(heads, n, rows) * scaling
    mask = causal_mask(n, rows, q.device) if shown is None else shown
    weights = eager_softmax(scores, mask, torch.promote_types(scores.dtype, torch.float32))
    return weights[..., needle].sum(dim=-1).mean(dim=-1)


@dataclass(frozen=True)
class Request:
    """One greedy answer asked of a cache: the `question`'s token ids (n,) at positions start … start + n − 1, at
    most `max_new_tokens` tokens, ending after a `stop` token produced by a decoding step; `index`, the example's
    global index (captured records carry it); `needle`, context positions whose attention mass the question's pass
    measures (the cache's rows must then be context positions), None to measure nothing; `settled`, where given, ends
    the answer as soon as it holds for the tokens produced so far (`--stop-answered`: its score is final)."""

    question: torch.Tensor
    start: int
    max_new_tokens: int
    stop: Collection[int]
    index: int
    needle: torch.Tensor | None = None
    settled: Callable[[Sequence[int]], bool] | None = None

    def answered(self, produced: Sequence[int]) -> bool:
        """Whether `settled` ends the answer at the tokens `produced` so far (never without one)."""
        return self.settled is not None and self.settled(produced)


def greedy_alone(model: torch.nn.Module, layers: int, cache: Buffers, request: Request,
                 recompression: Recompression | None = None) -> Decoded:
    """kvpress's greedy answer (see the module docstring) to `request` from one cache, `cache`, decoded on its own;
    `recompression`: a DecodingPress compressing the cache while the answer is decoded (the question's pass its
    first step)."""
    question, needle, index = request.question, request.needle, request.index
    if question.shape[-1] == 0:
        raise ValueError("the question holds no token: it must at least carry the template's generation suffix")
    masses: dict[int, torch.Tensor] = {}

    def substitute(captured: Captured) -> torch.Tensor:
        layer = captured.layer
        key, value = cache.extend(layer, captured.key[0], captured.value[0])
        q = captured.q[0]
        if needle is not None and q.shape[-2] > 1 and layer not in masses:
            found, shown = needle, cache.shown(layer)
            if shown is not None:  # a local layer's rows are its window's positions: the needle's among them (the
                found = torch.isin(cache.positions[layer][0, :key.shape[-2]], needle).nonzero().squeeze(-1)
                shown = shown[0]  # full cache's, the same in every head)
            masses[layer] = needle_mass(q, key, captured.scaling, found, shown)
        out = decode_attention(q, key, value, captured.scaling, cache.seen(layer), cache.shown(layer))[None]
        if recompression is not None:
            recompression.after(layer, cache, q, captured.scaling)
        return out

    def step(ids: torch.Tensor, first: int) -> int:
        positions = torch.arange(first, first + ids.shape[-1], device=ids.device)[None]
        cache.at = positions[0]
        if recompression is not None:
            recompression.seen = first + ids.shape[-1]
        logits = capture.forward(model, layers, None, substitute, [index], input_ids=ids[None], position_ids=positions,
                                 use_cache=False, logits_to_keep=1).logits
        return int(logits[0, -1].argmax())

    with threads(question.device):
        produced = [step(question, request.start)]
        position = request.start + question.shape[-1]
        for offset in range(request.max_new_tokens - 1):
            if request.answered(produced):
                break
            produced.append(step(question.new_tensor([produced[-1]]), position + offset))
            if produced[-1] in request.stop:
                break
    found = torch.stack([masses[layer] for layer in range(layers)]) if needle is not None else None
    return Decoded(produced, found)


def stop_tokens(model: torch.nn.Module) -> set[int]:
    """The token ids that end an answer: the model's generation config's EOS (one id or several), as kvpress reads."""
    eos = model.generation_config.eos_token_id
    return set() if eos is None else set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


def teacher_forced(model: torch.nn.Module, layers: int, cache: Buffers, tokens: torch.Tensor, start: int,
                   recompression: Recompression, index: int) -> tuple[torch.Tensor, list[int]]:
    """The logits (n, vocab) of `tokens` (n,) fed one decoding step each at positions start … start + n − 1 while
    `recompression` compresses `cache` every `interval` steps — kvpress's DecodingPress on a teacher-forced text. The
    steps between two compressions run as one causal pass (a token attends to the same rows either way). Also the
    rows each token attends to (the first global layer's cache, its own included: a local layer keeps its window),
    for the memory the press saves."""
    interval = 1 if recompression.size(start + 1) <= 1 else recompression.press.interval  # sizes never shrink
    logits, attended = [], []
    counted = next((layer for layer in range(layers) if not cache.local(layer)), 0)

    def substitute(captured: Captured) -> torch.Tensor:
        layer, q = captured.layer, captured.q[0]
        key, value = cache.extend(layer, captured.key[0], captured.value[0])
        out = decode_attention(q, key, value, captured.scaling, cache.seen(layer), cache.shown(layer))[None]
        recompression.after(layer, cache, q, captured.scaling, steps=q.shape[-2])
        return out

    done = 0
    while done < tokens.shape[-1]:
        count = min(interval - recompression.steps.get(counted, 0), tokens.shape[-1] - done)
        before = cache.lengths[counted]
        attended += range(before + 1, before + count + 1)
        positions = torch.arange(start + done, start + done + count, device=tokens.device)[None]
        cache.at = positions[0]
        recompression.seen = start + done + count
        logits.append(capture.forward(model, layers, None, substitute, [index],
                                      input_ids=tokens[None, done:done + count], position_ids=positions,
                                      use_cache=False).logits[0])
        done += count
    return torch.cat(logits), attended
