"""`chunk(<rowscorer>)`: a scorer applied to each chunk of the context on its own, every chunk keeping its share — so
the cache is compressed evenly along the context instead of where the scorer's scores happen to be high (FINCH,
Corallo & Papotti 2024, TACL, doi:10.1162/tacl_a_00716, which compresses a long document chunk by chunk).

kvpress 0.5.5's `ChunkPress(press, chunk_length=1024)`: the L context tokens are cut into chunks of CHUNK tokens from
the start (the last one shorter); each chunk of c tokens is scored by the scorer as if it were the whole context
(its keys and values alone) and keeps its max(1, int(c · (1 − r))) best tokens per key/value head (torch.topk). A
context of at most CHUNK tokens is the scorer itself.

The scorers it takes are the row scorers (declared `rowscorer`: streaming, knorm, keydiff, random, lagkv,
leverage): their score reads only the rows it is handed, so a chunk's rows are all it needs (`restricted`). kvpress
also hands a chunk to a scorer that reads queries (SnapKV, TOVA): it recomputes the queries of the chunk's last
tokens from their hidden states but rotates them at the *context's* last positions, which the prefill does not
carry (it keeps the post-RoPE queries of the context's last 64 positions only) — so those are refused before the
model loads.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Wrapper, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 72

#: kvpress's default chunk_length
CHUNK = 1024


def restricted(prefill: Prefill, rows: torch.Tensor | slice) -> Prefill:
    """The prefill of the cached rows `rows` (H_kv, m) alone, in that order per key/value head (or a slice of the
    context, the same at every head): what a row scorer reads (keys, values, pre-RoPE keys, the seed). It carries no
    queries (q and window have no rows) and no prefill pass (`kv.passes`): a scorer reading them is no row scorer."""
    def gathered(cached: torch.Tensor | None) -> torch.Tensor | None:
        if cached is None:
            return None
        if isinstance(rows, slice):
            return cached[:, rows]
        return cached.gather(1, rows[..., None].expand(-1, -1, cached.shape[-1]))

    key = gathered(prefill.key)
    heads, count = prefill.q.shape[0], key.shape[1]  # type: ignore[union-attr]
    return Prefill(prefill.layer, prefill.q[:, :0], key, gathered(prefill.value),  # type: ignore[arg-type]
                   gathered(prefill.key_pre), prefill.window.new_zeros(heads, 0, count), prefill.scaling,
                   prefill.seed, prefill.index)


def chunked_keep(scorer: Wrapper, prefill: Prefill, ratio: float, chunk: int = CHUNK) -> torch.Tensor:
    """(H_kv, m) the positions ChunkPress keeps, ascending: each chunk's max(1, int(c · (1 − ratio))) best by the
    wrapped scorer applied to that chunk's rows alone."""
    length = prefill.length
    kept = []
    for start in range(0, length, chunk):
        scores = scorer.scores(restricted(prefill, slice(start, start + chunk)), ratio)
        taken = max(1, int(scores.shape[-1] * (1 - ratio)))
        kept.append(start + scores.topk(taken, dim=-1).indices)
    return torch.cat(kept, dim=-1).sort(dim=-1).values


@register
class Chunk(Wrapper):
    """`chunk(<rowscorer>)`: the scorer applied to each chunk of CHUNK tokens alone, each keeping its share (see the
    module docstring)."""

    name, summary = "chunk", "a scorer's best tokens of each 1024-token chunk, scored alone"  # CHUNK, as a literal
    guide = (f"kvpress's `ChunkPress` (`chunk_length` {CHUNK}, after FINCH) over a row scorer ({{rowscorers}}): "
             f"the context is cut into chunks of {CHUNK} tokens, and each chunk is scored as if it were the whole "
             "context and keeps int(c · (1 − r)) of its c tokens, so every part of the context keeps its share: the "
             "ratio is the scorer's, the share of each chunk's tokens removed. A "
             f"context of at most {CHUNK} tokens is the scorer alone. Scorers that read queries (snapkv, tova, …) are "
             "refused: kvpress recomputes each chunk's last queries, which the prefill does not keep.")
    wraps, peer = "rowscorer", "ChunkPress"

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        kept = chunked_keep(self, prefill, ratio)
        return Compressed(kept, 1.0 - kept.shape[-1] / prefill.length)
