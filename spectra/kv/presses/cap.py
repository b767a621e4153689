"""`cap` (CAPKV, arXiv:2604.25975, as kvpress 0.5.5's CapPress): keep the tokens whose value adds the most capacity to
the output, weighed by how well their key aligns with the queries to come.

Per query head, a token j after the first SINKS gets a weight w_j = exp(τ·cos(k_j, μ_q) − max_j τ·cos(k_j, μ_q)) from
the cosine of its (post-RoPE) key with a query anchor μ_q — the mean over the context's queries after the sinks,
taken before RoPE and rotated by the mean of RoPE's rotations over the next FUTURE positions L … L + FUTURE − 1 (as
Expected Attention guesses a future query: `expected.mean_rotation`). The values u_j = v_j stand in for the directions
a token writes to the output, and the capacity matrix A = I + Σ_j w_j u_j u_jᵀ (with √(w_j + ε) scaling each u_j)
makes the score s_j = w_j · u_jᵀ A⁻¹ u_j, a weighted leverage: a token whose value points where few other weighted
values point scores high. The scores are averaged over each key/value group, the sinks scored the tensor's max + 1
(always kept), and the top n_kept kept per key/value head.

kvpress 0.5.5's CapPress is the peer, at its defaults: τ = 5, n_future_positions 512, n_sink 4, ε = 1e-6; the anchor
and keys L2-normalized (its note 1), the cosine clamped to [−1, 1], the max shift per head before exp (note 2), the
averaged future rotation (note 3), raw values as output directions (note 4); the queries rotated one by one and then
averaged, everything in the cache's dtype but A, A⁻¹u (torch.linalg.solve) and the leverage, in float32. It reads the
pre-RoPE queries of every context position (`queries`) and the model's RoPE (`needs_rope`).
"""

from __future__ import annotations

import torch
from torch.nn import functional

from .base import Prefill, ScorerPress, register
from .memo import remembered
from .expected import mean_rotation

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 46

#: kvpress's defaults: the temperature of the alignment weights, the future positions the query anchor is rotated
#: over, the first tokens left out and always kept, the term added to the weights inside the square root
TAU, FUTURE, SINKS, EPSILON = 5.0, 512, 4, 1e-6


def query_anchor(prefill: Prefill, future: int = FUTURE, sinks: int = SINKS) -> torch.Tensor:
    """(H, d) the mean of the context's pre-RoPE queries after the first `sinks`, each rotated by RoPE's mean rotation
    over the positions L … L + `future` − 1 (in the queries' dtype)."""
    query_pre = prefill.read("query_pre")
    if prefill.rope is None:
        raise ValueError("cap reads the model's RoPE, which this prefill lacks (a press reading it declares "
                         "`needs_rope`)")
    length = query_pre.shape[1]
    cos, sin = prefill.rope(torch.arange(length, length + future, device=prefill.key.device))
    rotation = mean_rotation(cos, sin).to(query_pre.dtype)
    return torch.matmul(query_pre[:, sinks:], rotation.T).mean(dim=1)


def cap_scores(prefill: Prefill, tau: float = TAU, future: int = FUTURE, sinks: int = SINKS,
               epsilon: float = EPSILON) -> torch.Tensor:
    """(H_kv, L) CAPKV's weighted leverage of each token after the first `sinks`, averaged over each key/value group;
    the sinks scored max + 1 (see the module docstring)."""
    if prefill.length <= sinks:
        raise ValueError(f"cap needs more than {sinks} context tokens, got {prefill.length}")
    groups, dim = prefill.groups, prefill.head_dim
    keys = prefill.key[:, sinks:].repeat_interleave(groups, dim=0)  # (H, T, d)
    values = prefill.value[:, sinks:].repeat_interleave(groups, dim=0)
    anchor = functional.normalize(query_anchor(prefill, future, sinks), p=2, dim=-1)
    cosine = torch.einsum("hd,htd->ht", anchor, functional.normalize(keys, p=2, dim=-1)).clamp(-1.0, 1.0)
    logits = tau * cosine
    weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))  # (H, T)
    scaled = values * torch.sqrt(weights + epsilon)[..., None]
    eye = torch.eye(dim, device=values.device, dtype=values.dtype)
    capacity = (eye + torch.einsum("htd,hte->hde", scaled, scaled)).to(torch.float32)  # A (H, d, d)
    directions = values.transpose(1, 2).to(torch.float32)  # (H, d, T)
    leverage = (directions * torch.linalg.solve(capacity, directions)).sum(dim=1)  # u_jᵀ A⁻¹ u_j, (H, T)
    scores = prefill.group_mean(weights * leverage)
    return functional.pad(scores, (sinks, 0), value=scores.max().item() + 1)


@register
class Cap(ScorerPress):
    """CAPKV: s_j = w_j u_jᵀ A⁻¹ u_j, the value's leverage in the capacity matrix weighted by its key's alignment
    with the rotated mean query; the first SINKS tokens kept (see the module docstring)."""

    name, summary = "cap", "the values of most capacity, weighted by key–query alignment"
    peer = "CapPress"
    needs_rope = True
    reads = ("query_pre",)
    min_context = 5  # more than its sinks

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        return remembered(prefill, self, lambda: cap_scores(prefill))  # the same at every ratio
