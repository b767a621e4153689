"""kvpress 0.5.5's DecodingPress: the cache kept at a target size *while* the answer is generated, by a scorer press.

`decoding(<scorer>)` (e.g. `decoding(knorm)`) compresses nothing after the prefill (kvpress's pipeline prefills a
DecodingPress without it). Then every `interval` decoding steps (kvpress's `compression_interval`, 512 by default;
`spectra cache --compression-interval`) each layer's whole cache — the context, the question and the tokens decoded
so far — is brought back to `target` rows by the scorer, right after that step's attention in that layer (kvpress's
forward hook), so the next step attends to the compressed cache. A step is one forward pass: the question's pass
(all its tokens) is the first, then one per generated token. A pass of at least `target` tokens compresses too.

spectra's `ratio` sets the target: `target = n_kept(L, ratio)`, the rows a press at that ratio keeps of the L-token
context (kvpress's `target_size` is absolute; spectra derives it so that `decoding(knorm)` at 0.5 and `knorm` at 0.5
keep caches of the same size, one compressed once after the prefill, the other again and again while decoding).

What the scorer sees at a compression, as kvpress hands it over: the keys and values of every cached row (in the
order the cache holds them) and the queries of the step's last token(s) — for TOVA the last token's post-RoPE query
over every row but its own; the ratio at which int(rows · (1 − ratio)) = target (kvpress searches for one; any such
ratio gives the same kept rows). The rows kept stay in the order torch.topk returns them, not in position order, as
kvpress gathers them: StreamingLLM's next compression then protects whichever rows come first, which after a first
compression are no longer the first four context tokens (kvpress's behaviour, kept to equal it).

The NLL protocol teacher-forces the continuation: its tokens are fed one step each, as kvpress would decode them
with every generated token replaced by the text's next token, so the cache is compressed after every `interval`
continuation tokens (spectra runs the `interval` tokens between two compressions in one pass: by causality the same).

Scorers: streaming, knorm and tova, declared `decodable` (the scorers whose kvpress score reads only the cached keys
or the last token's query; snapkv reads 64 buffered queries that kvpress rotates all at the current position, and
observed needs attention weights no SDPA decoding step returns — both refused).
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Press, ScorerPress, Wrapper, full, n_kept, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 90


def ratio_for(rows: int, target: int) -> float:
    """A ratio r with int(rows · (1 − r)) = target (0 when rows ≤ target): kvpress's DecodingPress searches for
    one; r = 1 − (target + ½)/rows lands half a token inside the interval that truncates to `target`."""
    if rows <= target:
        return 0.0
    ratio = 1.0 - (target + 0.5) / rows
    if n_kept(rows, ratio) != target:
        raise ArithmeticError(f"no ratio keeps {target} of {rows} rows")
    return ratio


@register
class DecodingPress(Wrapper):
    """`decoding(<decodable>)`: every `interval` decoding steps, each layer's cache brought back to `target` rows by
    `scorer` (see the module docstring); nothing compressed after the prefill. The registry's `decoding(knorm)`
    (`bind`) compresses every 512 steps (the class's `interval`, kvpress's default compression_interval, which
    `spectra cache --compression-interval` reads without torch); a run's (`for_run`) every `compression_interval` of
    its settings."""

    name, summary = "decoding", "kept at the ratio's size while decoding"
    peer = "DecodingPress"
    guide = ("kvpress's DecodingPress over a decodable scorer ({decodables}): it compresses while decoding (above); "
             "its ratio is the eviction ratio of its target.")
    wraps, decodes, interval = "decodable", True, 512

    def __init__(self, inner: ScorerPress | None = None, interval: int | None = None) -> None:
        super().__init__(inner)
        self.interval = type(self).interval if interval is None else interval

    def bind(self, inner: Press) -> DecodingPress:
        """This press around the scorer `inner` (one the registry's `wraps: "decodable"` checked)."""
        if not (isinstance(inner, ScorerPress) and inner.decodable):
            raise TypeError(f"{self.name} wraps a decodable scorer press, not {inner.name}")
        return type(self)(inner, self.interval)

    def fresh(self) -> DecodingPress:
        inner = None if self.inner is None else self.inner.fresh()
        return type(self)(inner, self.interval)  # type: ignore[arg-type]

    def for_run(self, compression_interval: int | None = None, **settings: object) -> DecodingPress:
        """This press for one run: compressing every `compression_interval` decoding steps (the run's option;
        None: INTERVAL)."""
        return type(self)(self.inner, compression_interval)

    @property
    def wrapped(self) -> ScorerPress:
        """The scorer it applies at every compression."""
        if self.inner is None:
            raise ValueError(f"{type(self).name} needs a scorer press: name it as {type(self).name}(<scorer>)")
        return self.inner

    @property
    def label(self) -> str:
        """What `--presses` calls it: decoding(<scorer>)."""
        return self.name

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        """After the prefill: the whole cache (compression waits for the decoding steps)."""
        return full(prefill)

    def target(self, context: int, ratio: float) -> int:
        """The rows each layer's cache is brought back to while decoding: those a press at `ratio` keeps of `context`
        tokens (its kept share and bytes are that eviction press's: `spectra.kv.cell`)."""
        return n_kept(context, ratio)

    def size(self, target: int, seen: int, ratio: float) -> int:
        """The rows a compression brings a layer's cache back to once `seen` tokens have been seen (the last logical
        position + 1, as kvpress reads it from `position_ids`), given the cell's `target` and `ratio`: here always
        `target` (kvpress's fixed target_size; compression_ratio_decoding's grows with `seen`)."""
        return target

    def due(self, steps: int, step_tokens: int, target: int) -> bool:
        """Whether a layer compresses after a step: `steps` since its last compression, `step_tokens` in this one."""
        return steps >= self.interval or step_tokens >= target

    def keep(self, layer: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, target: int,
             seed: int = 0, index: int = 0) -> torch.Tensor | None:
        """The rows (H_kv, target) of one layer's cache key, value (H_kv, M, d) that stay, in torch.topk's order, or
        None when M ≤ target (nothing to drop); q (H, n, d): the post-RoPE queries of the step's tokens (the last is
        what TOVA reads)."""
        if key.shape[-2] <= target:
            return None
        return torch.topk(self.scores(layer, q, key, value, scaling, target, seed, index), target, dim=-1).indices

    def scores(self, layer: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, target: int,
               seed: int = 0, index: int = 0) -> torch.Tensor:
        """The scorer's scores (H_kv, M) of every row of one layer's cache at a compression to `target` rows, as
        kvpress hands the cache over (see the module docstring); the arguments are `keep`'s."""
        last = q[:, -1:]
        attended = Prefill(layer, last, key, value, None, last_row(last, key, scaling), scaling, seed, index)
        return self.wrapped.score(attended, ratio_for(key.shape[-2], target))


def last_row(q: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """The attention (H, 1, M) of one query q (H, 1, d) over every row of key (H_kv, M, d), its own the last (all
    seen): scores · s, a softmax in float32 (or wider) cast back — what kvpress's TOVA computes at a decoding
    step."""
    heads, _, dim = q.shape
    kv_heads, rows = key.shape[0], key.shape[1]
    scores = torch.matmul(q.reshape(kv_heads, -1, dim), key.transpose(-1, -2)).view(heads, 1, rows) * scaling
    return torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)


#: kvpress's default compression_interval, declared once by the class
INTERVAL: int = DecodingPress.interval  # type: ignore[assignment]
