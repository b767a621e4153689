"""Cells decoded together: the compressed caches of many (press, ratio) cells — of one example or of several —
stacked into one batch, answered greedily by one batched forward pass per step.

A greedy answer reads all 135M weights of SmolLM2 for every token it produces; a batch of one is what made decoding,
not the prefill, the cost of a task sweep (1–2 s per cell at 4k, ~120 cells per example for a leaderboard). Every
cell of an example answers the same question (after the *original* context length, as kvpress passes its positions,
or after the m kept tokens of a press that renumbered them, `Cell.start`: each row its own positions), so the cells
differ only in the rows their caches hold: here they share each forward pass. Cells of several examples share it too
(`spectra evaluate --batch-size`): each row then has its own example's prefill (`CacheBatch.of`) and its own
request (`generation.Request`: question, start, global index, `max_new_tokens`), so the few rows still answering long
after the others stopped — the cost of a sweep — share their steps across examples.

Layout (`CacheBatch`): the context rows an eviction press keeps are the prefill's own, so where every row of a
layer compresses one prefill (one example: the default `--batch-size 1`), they are read in place
(`Shared`): the prefill's keys and values (H_kv, L, d) once, and per row which of the L it keeps (B, H_kv, L) — a
step then reads the context once for the whole batch rather than once per row, which made attention, bound by
memory, the largest cost of a step (measured: benchmarks/RESULTS.md). Rows whose cache is not the prefill's own
(quantized, low-rank, ThinK's pruned keys, re-rotated keys, a local layer's rows moved by `locallayers`) and batches
of several examples' prefills are laid out as copies: per layer one key and one value buffer (B, H_kv, M + room, d). Row b's copied cache
fills its first m_b columns (each key/value head its own count where a press keeps different numbers per head,
`Compressed.valid`); columns m_b … M − 1 are padding, hidden from every query; the question and the answer's tokens
are written at the same columns M, M + 1, … for every row, so a step writes one column for the whole batch. `seen`
(B, H_kv, M + room) marks the columns each head of each row attends to; attention is
`scaled_dot_product_attention` under that mask (and causal among the question's tokens) — the single-cell decoding's
call with padding hidden; on a layer read in place, one softmax over the shared context rows each row keeps and the
row's own columns (`shared_attention`). Each row's answer is its cell's, up to the float rounding of a differently
shaped sum (a tie in the greedy argmax is the only way two answers can differ; `tests/kv/test_batching.py` holds them
equal). Rows
that have stopped ride along until a tenth of the batch has stopped (`SHED`), then the batch keeps only the rows still
answering: a step's cost grows with its rows, and dropping rows copies only what they hold of their own.

Groups: the caches of a batch's cells may not fit in memory together. The probe (`probes.tasks`) decodes them in
groups whose buffers (padding and room included, `group_bytes`) and the rows the cells hold of their own
(`held_bytes`) stay within a memory budget (`kv.pending`); cells that keep the same number of rows (every eviction
press at one ratio of one example) pad nothing when they share a group.

Cells whose press compresses while decoding (`Cell.decodes`: decoding(<decodable>)) rewrite their caches mid-answer,
each at its own steps; they decode on their own (`generation.greedy_alone`), as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .. import capture, sliding
from ..capture import Captured
from ..kernels import causal_mask, softmax_dtype
from .generation import Decoded, Request, needle_mass, threads
from .presses import Compressed, Prefill

#: the share of the batch's rows still answering at or below which the batch drops the stopped ones. On the board's
#: answers (runs/board-artifacts, 250 examples × 17 cells) dropping at half computed 1.25× the row-steps the answers
#: need, at 0.9 1.02× for two more drops an example (RESULTS §34)
SHED = 0.9


def cell_rows(parts: Sequence[Compressed]) -> list[int]:
    """Per layer, the rows a cell's compressed context cache occupies (the widest head's, padding included)."""
    return [part.key.shape[-2] if part.kept is None else part.kept.shape[-1] for part in parts]


def held_bytes(parts: Sequence[Compressed]) -> int:
    """The bytes a cell's compressed cache holds of its own until it decodes: the rows of a press whose rows are
    not the prefill's (a transform, quantized rows), nothing for an eviction press (its kept positions only)."""
    return sum(tensor.numel() * tensor.element_size() for part in parts for tensor in (part.key, part.value)
               if tensor is not None)


def group_bytes(rows: Sequence[Sequence[int]], room: int, row_bytes: int) -> int:
    """The bytes of one group's buffers: per layer, as many columns as the group's widest cell plus `room`, times
    the cells, times `row_bytes` (the key and value of one token of every key/value head, and its mask bytes)."""
    return len(rows) * sum(max(layer) + room for layer in zip(*rows)) * row_bytes


def batch_row_bytes(kv_heads: int, key_dim: int, value_dim: int, itemsize: int) -> int:
    """The bytes one column of one cell takes in a `CacheBatch`: every key/value head's key, value and mask entry."""
    return kv_heads * ((key_dim + value_dim) * itemsize + 1)


@dataclass
class Shared:
    """One layer's context rows read in place: the prefill's `key` and `value` (H_kv, L, d) and, per batch row and
    key/value head, which of the L positions its eviction press keeps (`kept`, (B, H_kv, L) bool; none for a row
    whose cache is copied)."""

    key: torch.Tensor
    value: torch.Tensor
    kept: torch.Tensor


def in_place(part: Compressed) -> bool:
    """Whether a layer's compressed cache is rows of the prefill at its kept positions (an eviction press's)."""
    return part.kept is not None and part.key is None and part.window_positions is None


@dataclass
class CacheBatch:
    """The caches of B cells, every layer's laid out as the module docstring says: `keys[ℓ]`, `values[ℓ]`
    (B, H_kv, capacity, d), `seen[ℓ]` (B, H_kv, capacity) bool, and `filled[ℓ]`, the columns in use (the widest
    copied cell's context rows, then the tokens decoded so far); `shared[ℓ]`, the context rows read in place (None:
    every row's are copied)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    seen: list[torch.Tensor]
    filled: list[int]
    shared: list[Shared | None]
    #: per layer, its sliding window (None: global) and, for a local layer, each column's position per key/value head
    #: (B, H_kv, capacity): where its window reads the row (`Compressed.window_positions`, else `kept`)
    windows: list[int | None] = field(default_factory=list)
    positions: list[torch.Tensor | None] = field(default_factory=list)
    #: the positions (B, n) of the tokens of the pass under way (`greedy_batch` sets them before each forward pass)
    at: torch.Tensor | None = None

    @classmethod
    def of(cls, cells: Sequence[Sequence[Compressed]], prefills: Sequence[Prefill] | Sequence[Sequence[Prefill]],
           room: int) -> CacheBatch:
        """The batch of `cells` (each its compressed cache per layer) with `room` columns per layer for the question
        and the answer; `prefills` are every layer's prefill of the one example all cells compress, or one such list
        per cell (cells of several examples: an eviction press gathers its rows from its own example's)."""
        per_cell = [prefills] * len(cells) if isinstance(prefills[0], Prefill) else list(prefills)
        if len(per_cell) != len(cells):
            raise ValueError(f"{len(per_cell)} examples' prefills for a batch of {len(cells)} cells")
        keys, values, seen, filled, windows, positions, shared = [], [], [], [], [], [], []
        for layer, prefilled in enumerate(per_cell[0]):
            parted = [parts[layer] for parts in cells]
            alike = all(own[layer] is prefilled for own in per_cell)
            placed = [alike and in_place(part) for part in parted]
            shared.append(Shared(prefilled.key, prefilled.value, torch.stack([
                part.kept_mask(prefilled.length) if here else
                torch.zeros(prefilled.kv_heads, prefilled.length, dtype=torch.bool, device=prefilled.key.device)
                for part, here in zip(parted, placed)])) if any(placed) else None)
            empty = prefilled.key[:, :0], prefilled.value[:, :0]
            rows = [empty if here else part.rows(own[layer].key, own[layer].value)
                    for part, here, own in zip(parted, placed, per_cell)]
            width = max(key.shape[-2] for key, _ in rows)
            heads, dim = prefilled.key.shape[0], prefilled.key.shape[-1]
            key_buffer = prefilled.key.new_zeros(len(cells), heads, width + room, dim)
            value_buffer = prefilled.value.new_zeros(len(cells), heads, width + room, prefilled.value.shape[-1])
            mask = torch.zeros(len(cells), heads, width + room, dtype=torch.bool, device=prefilled.key.device)
            mask[:, :, width:] = True
            for row, ((key, value), part, here) in enumerate(zip(rows, parted, placed)):
                count = key.shape[-2]
                key_buffer[row, :, :count], value_buffer[row, :, :count] = key, value
                if not here:
                    mask[row, :, :count] = True if part.valid is None else part.valid
            keys.append(key_buffer)
            values.append(value_buffer)
            seen.append(mask)
            filled.append(width)
            windows.append(prefilled.sliding_window)
            positions.append(None if prefilled.sliding_window is None else
                             _positions([None if here else part for part, here in zip(parted, placed)], heads,
                                        width + room, mask.device))
        return cls(keys, values, seen, filled, shared, windows, positions)

    @property
    def size(self) -> int:
        """B, the cells in the batch."""
        return self.keys[0].shape[0]

    def extend(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write n new keys and values (B, H_kv, n, d) at the layer's next n columns; returns the filled columns."""
        start, count = self.filled[layer], key.shape[-2]
        if start + count > self.keys[layer].shape[-2]:
            raise ValueError(f"layer {layer}'s batch holds {self.keys[layer].shape[-2]} columns; {start + count} asked")
        self.keys[layer][:, :, start:start + count] = key
        self.values[layer][:, :, start:start + count] = value
        if self.local(layer):
            self.positions[layer][:, :, start:start + count] = self.at[:, None]
        self.filled[layer] = start + count
        return self.keys[layer][:, :, :start + count], self.values[layer][:, :, :start + count]

    def mask(self, layer: int, queries: int, heads: int) -> torch.Tensor:
        """(B, H, n, S) bool: what each of the n new queries of each query head sees of the layer's S filled
        columns — its cell's rows, and the new tokens causally."""
        seen = self.seen[layer][:, :, :self.filled[layer]]
        per_head = seen.repeat_interleave(heads // seen.shape[1], dim=1)[:, :, None, :]
        if self.local(layer):  # a sliding-window layer: each query sees its window of positions, per key/value head
            banded = sliding.band(self.at[:, None], self.positions[layer][:, :, :self.filled[layer]],
                                  self.windows[layer])
            return per_head & banded.repeat_interleave(heads // seen.shape[1], dim=1)
        if queries == 1:
            return per_head
        return per_head & causal_mask(queries, seen.shape[-1], seen.device)

    def local(self, layer: int) -> bool:
        """Whether `layer` attends through a sliding window (its columns carry positions)."""
        return bool(self.windows) and self.windows[layer] is not None

    def hide(self, columns: Sequence[int]) -> None:
        """Hide, in every layer, row b's next `columns[b]` columns from every query (a shorter question's left
        padding, written there by the question's pass)."""
        for layer in range(len(self.keys)):
            for row, count in enumerate(columns):
                if count:
                    self.seen[layer][row, :, self.filled[layer]:self.filled[layer] + count] = False

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (indices), in that order."""
        for layer in range(len(self.keys)):
            self.keys[layer] = self.keys[layer].index_select(0, rows)
            self.values[layer] = self.values[layer].index_select(0, rows)
            self.seen[layer] = self.seen[layer].index_select(0, rows)
            if self.local(layer):
                self.positions[layer] = self.positions[layer].index_select(0, rows)
            if self.shared[layer] is not None:
                found = self.shared[layer]
                self.shared[layer] = Shared(found.key, found.value, found.kept.index_select(0, rows))
        if self.at is not None:
            self.at = self.at.index_select(0, rows)


def batch_attention(batch: CacheBatch, layer: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           scaling: float) -> torch.Tensor:
    """The new queries q (B, H, n, d) over the layer's filled columns key, value (B, H_kv, S, d), each row over its
    own cell's rows (`CacheBatch.mask`; the rows read in place, `shared_attention`): (B, H, n, d)."""
    shared = batch.shared[layer]
    if shared is not None:
        band = None if not batch.local(layer) else sliding.band(  # a local layer: each query's window of positions
            batch.at, torch.arange(shared.key.shape[-2], device=q.device), batch.windows[layer])
        return shared_attention(shared, batch.mask(layer, q.shape[-2], key.shape[1]), q, key, value, scaling, band)
    mask = batch.mask(layer, q.shape[-2], q.shape[1])
    return torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling,
                                                            enable_gqa=q.shape[1] != key.shape[1])


def shared_attention(shared: Shared, mask: torch.Tensor, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     scaling: float, band: torch.Tensor | None = None) -> torch.Tensor:
    """The new queries q (B, H, n, d) over the context rows each row keeps of `shared` (on a sliding-window layer,
    within `band` (B, n, L): each query's window) and its own filled columns key, value (B, H_kv, S, d) under `mask`
    (B, H_kv, n, S): one softmax over both, as eager attention takes it; the shared rows' scores and weighted values
    by one product per key/value head for the whole batch. (B, H, n, d)."""
    size, heads, n, dim = q.shape
    kv_heads, length = shared.key.shape[0], shared.key.shape[-2]
    width = (heads // kv_heads) * n  # a key/value head's query rows: its group's heads, n each
    grouped = q.reshape(size, kv_heads, width, dim)
    across = grouped.transpose(0, 1).reshape(kv_heads, size * width, dim)
    context = torch.matmul(across, shared.key.transpose(-1, -2)).view(kv_heads, size, width, length).transpose(0, 1)
    scores = torch.cat([context, torch.matmul(grouped, key.transpose(-1, -2))], dim=-1) * scaling
    visible = shared.kept[:, :, None, :] if band is None else (shared.kept[:, :, None, :] & band[:, None]).repeat(
        1, 1, width // n, 1)
    seen = torch.cat([visible.expand(-1, -1, width, -1), mask.repeat(1, 1, width // n, 1)], dim=-1)
    scores.masked_fill_(~seen, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=softmax_dtype(scores.dtype)).to(q.dtype)
    kept = weights[..., :length].transpose(0, 1).reshape(kv_heads, size * width, length)
    out = torch.matmul(kept, shared.value).view(kv_heads, size, width, -1).transpose(0, 1)
    return (out + torch.matmul(weights[..., length:], value)).reshape(size, heads, n, -1)


def greedy_batch(model: torch.nn.Module, layers: int, batch: CacheBatch, requests: Sequence[Request]) -> list[Decoded]:
    """Each row's greedy answer to its request (one per row) from its cache, as `generation.greedy_alone` answers from one
    (the question's pass at positions start … start + n − 1, then one token a step, each row stopping after one of its
    stop tokens produced by a decoding step, up to its `max_new_tokens`, or once `settled`). Rows may answer different
    questions of one context from the same compressed caches: a shorter question is left-padded to the longest, its
    padding written at the columns before it and hidden like a cache's padding, so each row's question and answer sit at
    its own positions. A row's `needle`: the question's attention mass on the needle's context positions, measured on
    that row (whose cache rows must be context positions). Rows of several examples' cells share the batch, each with
    its own `start`, global `index` (which captured records carry) and `max_new_tokens`."""
    size = batch.size
    if len(requests) != size:
        raise ValueError(f"{len(requests)} requests for a batch of {size} rows")
    limits = [int(request.max_new_tokens) for request in requests]
    indices = [int(request.index) for request in requests]
    asked = [request.question for request in requests]
    if any(ids.shape[-1] == 0 for ids in asked):
        raise ValueError("the question holds no token: it must at least carry the template's generation suffix")
    longest = max(ids.shape[-1] for ids in asked)
    pads = [longest - ids.shape[-1] for ids in asked]
    device = asked[0].device
    ids = torch.stack([torch.cat([ids.new_full((pad,), int(ids[0])), ids]) for ids, pad in zip(asked, pads)])
    batch.hide(pads)
    measured = {row: request.needle for row, request in enumerate(requests) if request.needle is not None}
    masses: dict[tuple[int, int], torch.Tensor] = {}
    produced: list[list[int]] = [[] for _ in range(size)]
    live = list(range(size))  # the cell of each batch row still in the batch
    # each row's first column's position: its question's first token's, minus its padding
    base = torch.tensor([int(request.start) for request in requests], device=device) - torch.tensor(pads, device=device)

    def substitute(captured: Captured) -> torch.Tensor:
        layer, q = captured.layer, captured.q
        key, value = batch.extend(layer, captured.key, captured.value)
        if q.shape[-2] > 1:  # the question's pass
            for cell, found in measured.items():
                row = live.index(cell)
                columns = batch.seen[layer][row, 0, :key.shape[-2]].nonzero().squeeze(-1)
                rows, shown = key[row][:, columns], None
                held = batch.positions[layer][row, 0, columns] if batch.local(layer) else None
                shared = batch.shared[layer]
                if shared is not None:  # its context rows read in place come first
                    context = shared.kept[row, 0].nonzero().squeeze(-1)
                    rows = torch.cat([shared.key[:, context], rows], dim=1)
                    held = None if held is None else torch.cat([context, held])
                if batch.local(layer):  # its rows are its window's positions: the needle's among them, banded
                    found = torch.isin(held, found).nonzero().squeeze(-1)  # the full cache's: the same in every head
                    shown = sliding.band(batch.at[row, pads[cell]:], held, batch.windows[layer])
                masses[cell, layer] = needle_mass(q[row][:, pads[cell]:], rows, captured.scaling, found, shown)
        return batch_attention(batch, layer, q, key, value, captured.scaling)

    def step(ids: torch.Tensor, offset: int) -> list[int]:
        first = base[torch.tensor(live, device=ids.device)][:, None] + offset
        positions = (first + torch.arange(ids.shape[-1], device=ids.device)).clamp(min=0)  # padding's: any
        batch.at = positions
        logits = capture.forward(model, layers, None, substitute, [indices[row] for row in live], input_ids=ids,
                                 position_ids=positions, use_cache=False, logits_to_keep=1).logits
        return logits[:, -1].argmax(dim=-1).tolist()

    with threads(device):
        for row, token in zip(live, step(ids, 0)):
            produced[row].append(token)
        position = longest
        answering = [row for row in live if limits[row] > 1 and not requests[row].answered(produced[row])]
        for offset in range(max(limits) - 1):
            if not answering:
                break
            if len(answering) <= SHED * len(live):  # a tenth of the rows have stopped: drop them
                batch.keep(torch.tensor([live.index(row) for row in answering], device=device))
                live = list(answering)
            last = ids.new_tensor([[produced[row][-1]] for row in live])
            for row, token in zip(live, step(last, position + offset)):
                if row in answering:
                    produced[row].append(token)
                    request = requests[row]
                    if token in request.stop or len(produced[row]) == limits[row] or request.answered(produced[row]):
                        answering.remove(row)
    return [Decoded(ids, torch.stack([masses[row, layer] for layer in range(layers)]) if row in measured else None)
            for row, ids in enumerate(produced)]


def _positions(parts: Sequence[Compressed | None], heads: int, capacity: int, device: torch.device) -> torch.Tensor:
    """(B, H_kv, capacity) long: where each cell's local layer's window reads its copied context rows, per key/value
    head (`Compressed.window_positions`, else its kept positions; none for a row read in place, None), the columns
    after them to be written as tokens come."""
    found = torch.zeros(len(parts), heads, capacity, dtype=torch.long, device=device)
    for row, part in enumerate(parts):
        if part is None:
            continue
        at = part.kept if part.window_positions is None else part.window_positions
        if at is None:
            raise ValueError("a sliding-window layer's cache must hold context positions")
        found[row, :, :at.shape[-1]] = at
    return found
