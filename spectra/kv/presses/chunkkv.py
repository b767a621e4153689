"""ChunkKV (Liu et al. 2025, arXiv:2502.00299): evict whole chunks of consecutive tokens, not single tokens, so what
stays reads as phrases — a token survives with its neighbours, the context a later query needs to use it.

`chunkkv(<scorer>)` is kvpress 0.5.5's `ChunkKVPress(press, chunk_length=20)`. The scorer scores the L context
tokens per key/value head; the scores are summed over the key/value heads and the context is cut into chunks of
CHUNK tokens from its start (the last one shorter when CHUNK does not divide L). A chunk's score is the mean of its
tokens' summed scores; of the C chunks the max(1, int(C · (1 − r))) best (torch.topk) are kept whole, the same
positions at every key/value head. So the kept count is a number of chunks times their lengths, not kvpress's
n_kept of tokens: at L = 256 and r = 0.5, 6 of 13 chunks, 120 (or 116) tokens. A context shorter than one chunk is
left to the scorer itself (its own n_kept), as kvpress does.

`entropy_gated_chunkkv(<scorer>)` is kvpress 0.5.5's `EntropyGatedChunkKVPress(press, chunk_length=10,
low_entropy_chunk_length=4)`, which keeps exactly n_kept = max(1, int(L · (1 − r))) tokens, shared by the key/value
heads. The head-summed scores (float32) are cut into chunks of GATED tokens; each chunk has a score (its mean) and a
normalized entropy of its scores (shifted to be non-negative when a chunk has negative ones, p = s/(Σs + 1e-8),
H = −Σ p log(p + 1e-8) / log(chunk length), clamped to [0, 1]; a one-token tail chunk has entropy 0). Going through
the chunks by decreasing score while budget is left, a chunk is kept whole — unless it is important but spiky (score
≥ the median chunk score and entropy < the median entropy, torch's lower median), when only its SPIKY best tokens
are kept — and the last chunk reached keeps its best tokens that fit the budget. Budget the spiky chunks left
unspent goes to the best tokens not yet kept. The idea: a chunk whose weight is one token should not spend a whole
chunk of cache on it.

kvpress asserts that no attention weights are handed over, so it runs neither with ObservedAttentionPress; here the
received attention is just another score (`chunkkv(observed)` runs, without a kvpress peer).
"""

from __future__ import annotations

import math

import torch

from .base import Compressed, Prefill, Wrapper, evict, n_kept, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 71

#: kvpress's defaults: ChunkKVPress's chunk_length, EntropyGatedChunkKVPress's chunk_length and
#: low_entropy_chunk_length
CHUNK, GATED, SPIKY = 20, 10, 4

#: the ε of EntropyGatedChunkKVPress's normalisation and logarithm
EPSILON = 1e-8


def chunk_keep(scores: torch.Tensor, ratio: float, chunk: int = CHUNK) -> torch.Tensor:
    """(m,) ascending positions of the chunks ChunkKV keeps, given the scorer's `scores` (H_kv, L) with at least one
    whole chunk: the max(1, int(C · (1 − ratio))) chunks of `chunk` tokens (the last one the remainder) whose mean
    head-summed score is highest, computed as kvpress computes it."""
    length = scores.shape[-1]
    whole, rest = divmod(length, chunk)
    summed = scores.sum(dim=0)  # (L,), in the scorer's dtype
    means = summed[: whole * chunk].view(1, whole, chunk).mean(dim=-1)  # (1, whole)
    if rest:
        means = torch.cat([means, summed[-rest:][None].mean(dim=-1, keepdim=True)], dim=-1)
    kept_chunks = max(1, int((whole + (rest > 0)) * (1 - ratio)))
    chosen = means.topk(kept_chunks, dim=-1).indices[0]
    starts = chosen * chunk
    ends = torch.clamp(starts + chunk, max=length)
    return torch.cat([torch.arange(int(start), int(end), device=scores.device)
                      for start, end in zip(starts, ends)]).sort().values


def normalized_entropy(scores: torch.Tensor) -> torch.Tensor:
    """(…,) the entropy of each row of `scores` (…, c) as a distribution, over log c, clamped to [0, 1]: rows with
    negative scores shifted by their minimum first (EntropyGatedChunkKVPress's gate)."""
    shifted = scores - scores.amin(dim=-1, keepdim=True).clamp(max=0.0)
    p = shifted / (shifted.sum(dim=-1, keepdim=True) + EPSILON)
    return (-(p * (p + EPSILON).log()).sum(dim=-1) / math.log(scores.shape[-1])).clamp(0.0, 1.0)


def gated_keep(scores: torch.Tensor, keep: int, chunk: int = GATED, spiky: int = SPIKY) -> torch.Tensor:
    """(keep,) ascending positions EntropyGatedChunkKV keeps, given the scorer's `scores` (H_kv, L) and the budget
    `keep` (see the module docstring)."""
    summed = scores.sum(dim=0).float()  # (L,)
    length = summed.shape[0]
    whole, rest = divmod(length, chunk)
    bounds = [(start, min(start + chunk, length)) for start in range(0, length, chunk)]
    tokens = summed[: whole * chunk].view(whole, chunk)
    means, entropy = tokens.mean(dim=1), normalized_entropy(tokens)
    if rest:
        tail = summed[whole * chunk:]
        tail_entropy = (torch.zeros(1, device=summed.device) if rest == 1
                        else normalized_entropy(tail).unsqueeze(0))
        means = torch.cat([means, tail.mean().unsqueeze(0)])
        entropy = torch.cat([entropy, tail_entropy])
    important = (means >= means.median()).tolist()
    spiked = (entropy < entropy.median()).tolist()
    kept = torch.zeros(length, dtype=torch.bool, device=summed.device)
    budget = keep
    for index in torch.argsort(means, descending=True).tolist():
        if budget <= 0:
            break
        start, end = bounds[index]
        taken = min(end - start, budget)
        if important[index] and spiked[index]:
            taken = min(taken, spiky)
        if taken == end - start:
            kept[start:end] = True
        else:
            kept[torch.topk(summed[start:end], taken).indices + start] = True
        budget -= taken
    if budget > 0:
        left = (~kept).nonzero(as_tuple=False).squeeze(-1)
        if left.numel() > 0:
            kept[left[torch.topk(summed[left], min(budget, left.numel())).indices]] = True
    return kept.nonzero(as_tuple=False).squeeze(-1)


def shared(prefill: Prefill, positions: torch.Tensor) -> Compressed:
    """The cache keeping the same ascending `positions` at every key/value head."""
    return Compressed(positions.expand(prefill.kv_heads, -1), 1.0 - positions.numel() / prefill.length)


@register
class ChunkKV(Wrapper):
    """`chunkkv(<scorer>)`: the chunks of CHUNK tokens with the best mean head-summed score kept whole (see the module
    docstring)."""

    name, summary = "chunkkv", "a scorer's best chunks of 20 tokens, kept whole"  # CHUNK, as a literal
    guide = (f"ChunkKV (kvpress's `ChunkKVPress`, `chunk_length` {CHUNK}) over any scorer ({{scorers}}): the "
             f"scorer's scores are summed over the key/value heads and averaged over chunks of {CHUNK} consecutive "
             "tokens, and the best chunks are kept whole, the same at every head. The ratio is the share of chunks "
             "removed: of C chunks (the last one shorter) int(C · (1 − r)) stay, so the tokens kept are whole "
             "chunks, close to but not exactly the scorer's int(L · (1 − r)); a context shorter than "
             f"{CHUNK} tokens is left to the scorer. (kvpress refuses observed, which reads attention weights.)")
    wraps, peer = "scorer", "ChunkKVPress"
    ratio_means = "the share of its 20-token chunks removed"
    #: kvpress's keyword argument it takes (CHUNK, as a literal for the registry)
    fields = {"chunk_length": 20}
    chunk_length = CHUNK

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        scores = self.scores(prefill, ratio)
        if prefill.length < self.chunk_length:  # no whole chunk: the scorer's own eviction
            return evict(prefill, scores, n_kept(prefill.length, ratio))
        return shared(prefill, chunk_keep(scores, ratio, self.chunk_length))


@register
class EntropyGatedChunkKV(Wrapper):
    """`entropy_gated_chunkkv(<scorer>)`: ChunkKV's chunks of GATED tokens, a spiky important chunk cut to its SPIKY
    best tokens, n_kept tokens in all (see the module docstring)."""

    name = "entropy_gated_chunkkv"
    #: GATED and SPIKY, as a literal for --help
    summary = "a scorer's best chunks of 10 tokens, spiky ones cut to their 4 best"
    guide = (f"kvpress's `EntropyGatedChunkKVPress` (`chunk_length` {GATED}, `low_entropy_chunk_length` {SPIKY}) "
             "over any scorer ({scorers}): ChunkKV's chunks, chosen by their mean head-summed score, except that a "
             "chunk scoring at least the median whose scores have less than the median entropy (one token carries "
             f"it) keeps only its {SPIKY} best tokens, and what that saves goes to further chunks, then to the best "
             "tokens left. The ratio is the scorer's, the share of the cached tokens removed: it keeps exactly the "
             "scorer's int(L · (1 − r)) tokens, the same at every key/value head. "
             "(kvpress refuses observed, which reads attention weights.)")
    wraps, peer = "scorer", "EntropyGatedChunkKVPress"

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        return shared(prefill, gated_keep(self.scores(prefill, ratio), n_kept(prefill.length, ratio)))
