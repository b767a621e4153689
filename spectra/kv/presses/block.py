"""`block(<rowscorer>)`: block-wise iterative eviction — the cache is filled block by block as a chunked prefill would
fill it, and after each block only the n_kept best rows of what is cached so far stay, so every token competes only
with the survivors of the blocks before it (KeyDiff, Park et al. 2025, arXiv:2504.15364, evicts this way to run a
long prompt in a fixed cache).

kvpress 0.5.5's `BlockPress(press, block_size=128)` simulates it after one exact forward pass: with n_kept =
max(1, int(L · (1 − r))), the first n_kept tokens are the starting cache; then for each block of BLOCK tokens from
position n_kept on (the last one shorter; BLOCK is L when the context is shorter), the scorer scores the cached rows
followed by the block's (in that order: the survivors in the order torch.topk returned them, then the block's in
position order) as if they were the whole context, at the same ratio, and the n_kept best of them stay, per key/value
head. Each head keeps n_kept tokens. When n_kept + BLOCK ≥ L there is one step over the whole context: the scorer
itself.

The scorers it takes are the row scorers (declared `rowscorer`: streaming, knorm, keydiff, random, lagkv,
leverage), which read only the rows handed to them (`chunk.restricted`): kvpress also hands the gathered rows to
scorers reading queries (SnapKV, TOVA), recomputed from the hidden states of the block's last tokens but rotated at
the context's last positions, which the prefill does not carry — so those are refused before the model loads.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Wrapper, n_kept, register
from .chunk import restricted

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 73

#: kvpress's default block_size
BLOCK = 128


def block_keep(scorer: Wrapper, prefill: Prefill, ratio: float, block: int = BLOCK) -> torch.Tensor:
    """(H_kv, n_kept) the positions BlockPress keeps, ascending: the survivors of scoring, block after block, the
    rows kept so far followed by the next block's, with the wrapped scorer."""
    length, heads, device = prefill.length, prefill.kv_heads, prefill.key.device
    block = min(block, length)
    keep = n_kept(length, ratio)
    kept = torch.arange(keep, device=device).expand(heads, -1)
    for start in range(keep, length, block):
        rows = torch.cat([kept, torch.arange(start, min(start + block, length), device=device).expand(heads, -1)],
                         dim=-1)
        scores = scorer.scores(restricted(prefill, rows), ratio)
        kept = rows.gather(-1, scores.topk(keep, dim=-1).indices)
    return kept.sort(dim=-1).values


@register
class Block(Wrapper):
    """`block(<rowscorer>)`: the context's rows evicted block by block down to n_kept (see the module docstring)."""

    name, summary = "block", "a scorer's best tokens, evicted block by block of 128"  # BLOCK, as a literal
    guide = (f"kvpress's `BlockPress` (`block_size` {BLOCK}, KeyDiff's block-wise eviction) over a row scorer "
             f"({{rowscorers}}): the context enters the cache in blocks of {BLOCK} tokens after its first "
             "int(L · (1 − r)), and after each block the scorer, given only the cached rows and the block's, keeps "
             "the int(L · (1 − r)) best, so a token competes with the survivors of earlier blocks, not with the "
             "whole context. The ratio is the scorer's: each key/value head keeps its int(L · (1 − r)). Scorers that read queries (snapkv, tova, "
             "…) are refused: kvpress recomputes each block's last queries, which the prefill does not keep.")
    wraps, peer = "rowscorer", "BlockPress"
    #: kvpress's keyword argument it takes (BLOCK, as a literal for the registry)
    fields = {"block_size": 128}
    block_size = BLOCK

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        kept = block_keep(self, prefill, ratio, self.block_size)
        return Compressed(kept, 1.0 - kept.shape[-1] / prefill.length)
