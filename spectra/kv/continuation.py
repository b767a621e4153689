"""The KV-cache engine of `spectra cache`: an exact prefill read into `presses.Prefill`, the continuation scored
against compressed caches, and what is lost, per head and per token.

One forward pass over a sequence's L + C tokens serves everything: by causality its first L positions are the exact
prefill of the context (so `prefill` reads each layer's post-RoPE queries, keys, values and attention rows off the
captured record), and its last C rows are the continuation's *full-cache* attention, the reference the per-head
measures compare against. Each press then compresses each layer's cache once, and `continuation_logits` runs the
C − 1 continuation tokens (positions L … L + C − 2, their original RoPE positions, as kvpress's pipeline passes
them; m … m + C − 2 after a press that renumbers its m kept tokens 0 … m − 1, `Compressed.start`) through the model with an attention that sees the compressed context and the continuation causally — every
(press, ratio) a row of one batched forward pass, the caches padded to a common length and the padding masked.
Token 0 of the continuation is predicted from the context's last position, whose logits no press changes. A
sliding-window layer (`spectra.sliding`: Gemma 3's local layers) is attended as the model attends it: each
continuation query sees the cached rows and continuation tokens whose positions lie within its window (a row's
position: `Compressed.window_positions`, else its kept one; `kv.locallayers` says what a press leaves there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import capture, sliding
from . import passes
from ..capture import Captured
from ..kernels import causal_mask, eager_softmax, scores
from ..models import Rope
from .presses import Compressed, Prefill
from .presses.base import WINDOW
from .presses.rerotation import rotate_half

class Stacked(NamedTuple):
    """A layer's compressed caches for the rows of a forward pass: `key`, `value` (R, H_kv, M, d), `valid` (R, H_kv,
    M); a sliding-window layer's window W and each row's position (R, H_kv, M), where its window reads it
    (`Compressed.window_positions`, else `kept`), None for a global layer."""

    key: torch.Tensor
    value: torch.Tensor
    valid: torch.Tensor
    window: int | None = None
    positions: torch.Tensor | None = None


def from_captured(captured: Captured, row: int, context: int, key_pre: torch.Tensor | None, seed: int,
                  index: int, w_o: torch.Tensor | None = None, rope: Rope | None = None, *,
                  reads: Sequence[str] = ("received",), hooked: Mapping[str, torch.Tensor] | None = None,
                  sliding_window: int | None = None) -> Prefill:
    """Sequence `row`'s exact prefill of `context` tokens, read off a captured layer of a longer causal forward
    pass (rows < context of a causal P see only the context). `key_pre` (H_kv, L, d): its keys before RoPE; `w_o`:
    the layer's output projection W^O (D, H·d); `rope`: the model's rotation (`models.rope`); `reads`: the layer
    passes computed (`kv.passes`: the received attention from P itself), from `hooked`, this row's hooked outputs
    of the context a pass needs ("q": the query projection (L, H·d); "input": the attention input (L, D));
    `sliding_window`: a local layer's W (`spectra.sliding`: its P, the model's, is banded already)."""
    window = min(WINDOW, context)
    p = captured.p[row]
    seen = passes.Seen(captured.q[row, :, :context], captured.key[row, :, :context], captured.value[row, :, :context],
                       captured.scaling, hooked or {}, p=p[:, :context, :context])
    return Prefill(captured.layer, captured.q[row, :, context - window:context], seen.key, seen.value, key_pre,
                   p[:, context - window:context, :context], captured.scaling, seed, index, w_o=w_o, rope=rope,
                   sliding_window=sliding_window, passes=passes.computed(reads, seen))


def stack(parts: Sequence[Compressed], key: torch.Tensor, value: torch.Tensor,
          sliding_window: int | None = None) -> Stacked:
    """Several compressed caches of one layer as one batch, padded to the longest; `key`, `value` (H_kv, L, d) are
    the prefill's (the rows of eviction presses are gathered from them). A cache's padding — to the longest, and
    its own per-head padding (`Compressed.valid`) — is marked invalid. A local layer's (`sliding_window` W) rows
    carry their positions."""
    rows = [part.rows(key, value) for part in parts]
    longest = max(k.shape[-2] for k, _ in rows)
    heads, dim = key.shape[0], key.shape[-1]
    keys = key.new_zeros(len(rows), heads, longest, dim)
    values = value.new_zeros(len(rows), heads, longest, value.shape[-1])
    valid = torch.zeros(len(rows), heads, longest, dtype=torch.bool, device=key.device)
    positions = None if sliding_window is None else torch.zeros_like(valid, dtype=torch.long)
    for i, ((k, v), part) in enumerate(zip(rows, parts)):
        keys[i, :, : k.shape[-2]], values[i, :, : v.shape[-2]] = k, v
        valid[i, :, : k.shape[-2]] = True if part.valid is None else part.valid
        if positions is not None:
            at = part.kept if part.window_positions is None else part.window_positions
            if at is None:
                raise ValueError("a sliding-window layer's cache must hold context positions")
            positions[i, :, : k.shape[-2]] = at
    return Stacked(keys, values, valid, sliding_window, positions)


def cached_attention(q: torch.Tensor, cached: Stacked, key: torch.Tensor, value: torch.Tensor, scaling: float,
                     at: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of new queries q (R, H, n, d) over a cache (`Stacked`, its valid rows) and the new tokens' own keys
    and values (R, H_kv, n, d) causally — a local layer's within its window of positions, the new tokens' at `at`
    (R, n) —: the operations of eager attention (scores · s, a softmax in float32 — or wider, for a float64 model —
    cast back, weights · values). Returns (R, H, n, d)."""
    groups = q.shape[1] // key.shape[1]
    keys = torch.cat([cached.key, key], dim=-2).repeat_interleave(groups, dim=1)
    values = torch.cat([cached.value, value], dim=-2).repeat_interleave(groups, dim=1)
    n, valid = q.shape[-2], cached.valid
    allowed = torch.cat([valid[:, :, None, :].expand(-1, -1, n, -1),
                         causal_mask(n, n, q.device).expand(*valid.shape[:2], n, n)], dim=-1)
    if cached.window is not None:  # each query sees the rows whose positions lie within its window
        if at is None:
            raise ValueError("a sliding-window layer's attention needs the new tokens' positions")
        rows = torch.cat([cached.positions, at[:, None, :].expand(-1, valid.shape[1], -1)], dim=-1)
        allowed = allowed & sliding.band(at[:, None, :], rows, cached.window)
    weights = eager_softmax(scores(q, keys, scaling), allowed.repeat_interleave(groups, dim=1), q.dtype)
    return torch.matmul(weights, values)


def moved(rows: torch.Tensor, shift: int, rope: Rope | None) -> torch.Tensor:
    """Post-RoPE rows (…, n, d) moved by `shift` positions, R(shift)·x, with the model's `rope` (its scaling, the
    cosine at position 0, divided out: the rows carry it already); unchanged for a shift of 0."""
    if shift == 0:
        return rows
    if rope is None:
        raise ValueError("moving rows to other positions needs the model's RoPE")
    cos, sin = rope(torch.tensor([shift, 0], device=rows.device))
    scale = cos[1]
    return rows * (cos[0] / scale) + rotate_half(rows) * (sin[0] / scale)


@dataclass(frozen=True, eq=False)
class Tail:
    """What the per-head measures read of one layer's continuation rows in the full-cache pass: the C continuation
    queries `q` (H, C, d), their full attention on the L context keys `on_context` (H, C, L), their full-cache output
    `exact` (H, C, d), the continuation's own keys and values `key`, `value` (H_kv, C, d) and the score scale."""

    q: torch.Tensor
    on_context: torch.Tensor
    exact: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float

    @classmethod
    def of(cls, captured: Captured, row: int, context: int) -> Tail:
        """Sequence `row`'s continuation rows of a captured layer (views: `kept` copies them)."""
        full_rows = captured.p[row, :, context:, :]  # (H, C, L + C)
        return cls(captured.q[row, :, context:], full_rows[..., :context], torch.matmul(full_rows, captured.v[row]),
                   captured.key[row, :, context:], captured.value[row, :, context:], captured.scaling)

    def kept(self) -> Tail:
        """A copy owning its tensors, for measures taken after the forward pass (a press that reconstructs)."""
        return Tail(self.q.clone(), self.on_context.clone(), self.exact.clone(), self.key.clone(), self.value.clone(),
                    self.scaling)


def head_measures(captured: Captured, row: int, context: int, parts: Sequence[Compressed], prefilled: Prefill
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per compressed cache and query head of this layer, with the layer's exact inputs (R = len(parts)):

    - `mass` (R, H): the share of the continuation queries' full-attention mass on the context that falls on kept
      context tokens, averaged over the continuation queries that attend to the context (a local layer's beyond its
      window attend to none of it) — NaN for caches whose rows are not tokens;
    - `error` (R, H): ‖o − o_full‖_F / ‖o_full‖_F of the head's output over the C continuation rows, o attending
      to the compressed cache (and the continuation), o_full to the full one.
    """
    return tail_measures(Tail.of(captured, row, context), parts, prefilled)


def tail_measures(tail: Tail, parts: Sequence[Compressed], prefilled: Prefill) -> tuple[torch.Tensor, torch.Tensor]:
    """`head_measures` from a layer's continuation rows (`Tail`)."""
    q, exact, count = tail.q, tail.exact, len(parts)
    cached = stack(parts, prefilled.key, prefilled.value, prefilled.sliding_window)
    shifts = [0 if part.start is None else part.start - prefilled.length for part in parts]
    queries, keys = q.expand(count, -1, -1, -1), tail.key.expand(count, -1, -1, -1)
    if any(shifts):  # a press that renumbered its kept tokens: the continuation sits at its start, not at L
        queries = torch.stack([moved(q, shift, prefilled.rope) for shift in shifts])
        keys = torch.stack([moved(tail.key, shift, prefilled.rope) for shift in shifts])
    at = prefilled.length + torch.tensor(shifts, device=q.device)[:, None] + torch.arange(q.shape[-2], device=q.device)
    out = cached_attention(queries, cached, keys, tail.value.expand(count, -1, -1, -1), tail.scaling, at)
    error = (out - exact).flatten(2).norm(dim=-1) / exact.flatten(1).norm(dim=-1).clamp_min(1e-30)
    on_context = tail.on_context  # (H, C, L)
    context = on_context.shape[-1]
    total = on_context.sum(dim=-1)  # (H, C): 0 for a query whose window holds no context token
    total = torch.where(total > 0, total, float("nan"))
    groups = prefilled.groups
    mass = torch.full_like(error, float("nan"))
    for i, part in enumerate(parts):
        if part.kept is None:
            continue
        kept = part.kept_mask(context).repeat_interleave(groups, dim=0)[:, None, :]
        mass[i] = torch.nanmean((on_context * kept).sum(dim=-1) / total, dim=-1)
    return mass, error


def continuation_logits(model: torch.nn.Module, layers: int, caches: Callable[[int], Stacked], tokens: torch.Tensor,
                        start: int | Sequence[int], index: int, rows: int) -> torch.Tensor:
    """Logits (rows, n, vocab) of the n `tokens` at positions start … start + n − 1 (one `start`, or one per row:
    `cell.start`), row r of every layer attending to row r of `caches(layer)` and causally to the tokens themselves
    (their keys and values are not cached)."""
    n = tokens.shape[-1]
    ids = tokens.reshape(1, n).expand(rows, -1)
    first = torch.as_tensor(start, device=tokens.device).reshape(-1, 1).expand(rows, 1)
    positions = first + torch.arange(n, device=tokens.device)

    def substitute(captured: Captured) -> torch.Tensor:
        return cached_attention(captured.q, caches(captured.layer), captured.key, captured.value, captured.scaling,
                                positions)

    outputs = capture.forward(model, layers, None, substitute, [index] * rows, input_ids=ids, position_ids=positions,
                              use_cache=False)
    return outputs.logits


def token_measures(logits: torch.Tensor, targets: torch.Tensor, reference: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row and token of `logits` (R, C, vocab), in float64: the negative log-likelihood of `targets` (C,), the
    KL divergence KL(reference ‖ row) from the `reference` log-probabilities (C, vocab), and whether the row's
    top-1 token is the reference's."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    nll = -logp.gather(-1, targets.reshape(1, -1, 1).expand(logp.shape[0], -1, 1))[..., 0]
    kl = (reference.exp() * (reference - logp)).sum(dim=-1)
    agree = logp.argmax(dim=-1) == reference.argmax(dim=-1)
    return nll, kl, agree
