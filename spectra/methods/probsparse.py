"""`probsparse`: Informer's ProbSparse self-attention (Zhou et al. 2021) with k active queries.

The u = k queries with the largest sparsity measurement M̄(q) = max − mean of their scores over
c·⌈ln m⌉ sampled keys keep their exact rows of P; every other query gets a uniform row (the mean of V).
u ≥ m is exact. Cost O(n d (k + c ln n)) per head.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ..seeds import Domain, derive_seed
from ..kernels import scores
from .base import Approximation, Draws, Layer, Method, register, valid_first

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 80

#: Informer's sampling factor c: c·⌈ln m⌉ sampled keys per query for M̄
INFORMER_FACTOR = 5


@lru_cache(maxsize=256)
def _informer_draws(seed: int, layer: int, heads: int, n: int, count: int) -> np.ndarray:
    """Uniforms (H, n, count) shared by every sequence (fixed draws); column t of head h comes from its own
    generator, so a shorter n is a prefix."""
    return np.stack([
        np.stack([np.random.default_rng(derive_seed(seed, Domain.PROBSPARSE, layer, head, t)).random(n)
                  for t in range(count)], axis=-1)
        for head in range(heads)
    ])


def _sequence_draws(seed: int, layer: int, heads: int, n: int, count: int, width: int, sequence: int) -> np.ndarray:
    """Uniforms (H, n, width) of one sequence: head h's (n, count) block row by row from one generator fixed
    by (seed, layer, head, sequence), so a shorter n is a prefix; columns past `count` are never used."""
    drawn = np.zeros((heads, n, width))
    for head in range(heads):
        drawn[head, :, :count] = np.random.default_rng(
            derive_seed(seed, Domain.PROBSPARSE, layer, head, sequence)).random((n, count))
    return drawn


def probsparse_sample(x: Layer, draws: Draws) -> tuple[torch.Tensor, torch.Tensor]:
    """Key positions (B, H, n, c) sampled for each query and their mask (B, 1, 1, c).

    As Informer: c = min(INFORMER_FACTOR·⌈ln m⌉, m) keys per query, uniform over the m valid keys, with
    replacement. Draw t of query i of head h is ⌊u·m⌋ for a uniform u drawn per sequence, from a generator
    fixed by (seed, layer, head, the sequence's global index) (`_sequence_draws`); with fixed draws, u is the
    i-th number of a generator fixed by (seed, layer, head, t), shared by every sequence. Either way the
    draws are the same for every budget (so the top-k sets are nested) and, for right padding, the same for
    a sequence alone or padded in a batch.
    """
    heads, n = x.q.shape[1:3]
    lengths = np.maximum(x.valid.sum(-1).cpu().numpy(), 1)[:, None, None, None]  # (B, 1, 1, 1)
    counts = np.minimum(INFORMER_FACTOR * np.ceil(np.log(lengths[:, 0, 0, 0])).astype(np.int64), lengths[:, 0, 0, 0])
    counts = np.maximum(counts, 1)
    width = int(counts.max())
    if draws.per_sequence:
        uniforms = np.stack([_sequence_draws(draws.seed, x.layer, heads, n, int(count), width, sequence)
                             for count, sequence in zip(counts, draws.index)])  # (B, H, n, c)
    else:
        uniforms = _informer_draws(draws.seed, x.layer, heads, n, width)[None]  # (1, H, n, c) in float64, any device
    ranks = torch.from_numpy(np.minimum((uniforms * lengths).astype(np.int64), lengths - 1)).to(x.valid.device)
    order = valid_first(x.valid)[:, None, :].expand(-1, heads, -1)  # (B, H, n)
    positions = torch.gather(order, -1, ranks.flatten(-2)).view(ranks.shape)
    used = np.arange(counts.max()) < counts[:, None]
    return positions, torch.from_numpy(used).to(x.valid.device)[:, None, None, :]


@register
class ProbSparse(Method):
    """Informer's ProbSparse self-attention with u = k active queries."""

    random = True
    variants = {"probsparse": {"color": "#637939", "marker": "d"}}

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        """Informer's ProbSparse self-attention: the u = k queries with the largest sparsity measurement
        M̄(q_i) = max_j s_ij − mean_j s_ij, s_ij = s q_i·k_j over the sampled keys (`probsparse_sample`),
        keep their exact rows of P; every other query gets the mean of V over the valid keys (a uniform row
        of P̃). Padded queries are never chosen; with u ≥ m every valid row is exact."""
        positions, used = probsparse_sample(x, draws)
        logits = scores(x.q, x.k, x.scaling)  # only the sampled entries are read
        sampled = torch.gather(logits, -1, positions)  # (B, H, n, c)
        peak = sampled.masked_fill(~used, float("-inf")).amax(-1)
        mean = (sampled * used).sum(-1) / used.sum(-1)
        sparsity = (peak - mean).masked_fill(~x.valid[:, None, :], float("-inf"))  # M̄ (B, H, n)
        rank = torch.argsort(torch.argsort(sparsity, dim=-1, descending=True, stable=True), dim=-1)
        active = (rank < budget)[..., None]  # (B, H, n, 1)
        keys = x.valid[:, None, None, :].to(x.q.dtype)
        uniform = keys / keys.sum(-1, keepdim=True)
        p_tilde = torch.where(active, x.p, uniform)  # x.p's rows are softmax(q_i Kᵀ s) over valid keys
        return Approximation(p_tilde @ x.v, p_tilde)
