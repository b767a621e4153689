"""`expected_attention` (Expected Attention, Devoto et al. 2025, arXiv:2510.00636): keep the keys that the
*future* queries are expected to attend to, estimated from the statistics of the context's own queries.

A query after the context is not known when the cache is compressed, but its distribution can be guessed: per query
head, the context's queries before RoPE (the first SINKS left out, outliers) have a mean μ and a covariance Σ (divided
by their count). A future query at position p is that query rotated by RoPE's R(p); averaged over the next FUTURE
positions L … L + FUTURE − 1, R̄ = mean_p R(p), the future query has mean R̄μ and covariance R̄ΣR̄ᵀ. For a Gaussian
query, E[exp(q·k/√d)] = exp(k·R̄μ/√d + kᵀR̄ΣR̄ᵀk/(2d)), so each (post-RoPE, cached) key's expected attention is the
softmax over the keys after the sinks of z_j = k_j·R̄μ/√d + k_jᵀR̄ΣR̄ᵀk_j/(2d). It is averaged over the query heads of
each key/value head and weighted by the value's norm, (a_j + ε)·‖v_j‖ (what key j would add to the output; kvpress's
`use_vnorm=False` drops the weight and ε, as kvpress's evaluation registry's CriticalKV configurations do); the first
SINKS tokens are always kept (scored the tensor's max + 1), and the top n_kept scores kept per key/value head.

kvpress 0.5.5's ExpectedAttentionPress is the peer, at its defaults: n_future_positions 512, n_sink 4,
use_covariance and use_vnorm on, epsilon 0; the scale is 1/√d of the head dimension (not the model's score scale), the
mean rotation is the mean of the rotation matrices RoPE's own cos and sin make (the model's rotary embedding, with its
scaling), and everything is computed in the cache's dtype. It needs the pre-RoPE queries of every context position,
which the prefill keeps only for a press declaring `queries`, and the model's RoPE (`needs_rope`).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional

from .base import Prefill, ScorerPress, register
from .memo import remembered

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 45

#: kvpress's defaults: the future positions averaged over, the first tokens left out and always kept, the term added
#: to the expected attention before the value norm weighs it
FUTURE, SINKS, EPSILON = 512, 4, 0.0


def mean_rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(d, d) the mean over positions of RoPE's rotation matrices R(p) = diag(cos_p) + J·diag(sin_p), given cos, sin
    (F, d) at F positions, where J is rotate-half's matrix (J x = [−x₂, x₁] for x = [x₁, x₂]): R(p)x = x·cos_p +
    rotate_half(x)·sin_p, the rotation a query at position p gets. Its entries are means of cos and ±sin over the
    positions, so they are averaged as vectors, not as F matrices of d × d (kvpress's way, the same numbers)."""
    dim, half = cos.shape[-1], cos.shape[-1] // 2
    cos_mean, sin_mean = cos.mean(dim=0), sin.mean(dim=0)
    rotation = torch.diag(cos_mean)
    low, high = torch.arange(half, device=cos.device), torch.arange(half, dim, device=cos.device)
    rotation[high, low] = sin_mean[:half]  # J·diag(sin): row d/2 + i takes +x_i, row i takes −x_{d/2+i}
    rotation[low, high] = -sin_mean[half:]
    return rotation


def future_query(query_pre: torch.Tensor, rotation: torch.Tensor, sinks: int = SINKS
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean (H, d), covariance (H, d, d)) of a future query per head: the statistics of the pre-RoPE queries
    `query_pre` (H, L, d) after the first `sinks`, rotated by the mean rotation `rotation` (d, d)."""
    queries = query_pre[:, sinks:]
    mean = queries.mean(dim=1, keepdim=True)
    centred = queries - mean
    covariance = torch.einsum("hsi,hsj->hij", centred, centred) / queries.shape[1]
    return mean[:, 0] @ rotation.T, rotation @ (covariance @ rotation.T)


def expected_scores(prefill: Prefill, future: int = FUTURE, sinks: int = SINKS, epsilon: float = EPSILON,
                    use_vnorm: bool = True) -> torch.Tensor:
    """(H_kv, L) the expected attention of the next `future` queries to each cached key after the first `sinks`,
    averaged over each key/value group and (`use_vnorm`) weighted by the value norm; the sinks scored max + 1 (see the
    module docstring)."""
    if prefill.length <= sinks:
        raise ValueError(f"expected_attention needs more than {sinks} context tokens, got {prefill.length}")
    query_pre = prefill.read("query_pre")
    if prefill.rope is None:
        raise ValueError("expected_attention reads the model's RoPE, which this prefill lacks (a press reading it "
                         "declares `needs_rope`)")
    mean, covariance = future_query(query_pre, future_rotation(prefill, future), sinks)
    return expected_attention(prefill, mean, covariance, sinks, epsilon, use_vnorm)


def future_rotation(prefill: Prefill, future: int = FUTURE) -> torch.Tensor:
    """(d, d) RoPE's rotation averaged over the `future` positions after the context, L … L + future − 1, in the
    cache's dtype (`mean_rotation`)."""
    positions = torch.arange(prefill.length, prefill.length + future, device=prefill.key.device)
    cos, sin = prefill.rope(positions)  # type: ignore[misc]
    return mean_rotation(cos, sin).to(prefill.key.dtype)


def expected_attention(prefill: Prefill, mean: torch.Tensor, covariance: torch.Tensor, sinks: int = SINKS,
                       epsilon: float = EPSILON, use_vnorm: bool = True) -> torch.Tensor:
    """(H_kv, L) the expected attention to each cached key after the first `sinks` of a future query of mean `mean`
    (H, d) and covariance `covariance` (H, d, d), both rotated to the future positions: softmax over the keys of
    k·μ/√d + kᵀΣk/(2d), averaged over each key/value group, weighted by the value norm, (a + ε)·‖v‖ — or, without
    `use_vnorm`, the attention a alone (kvpress adds ε only with the norm); the sinks scored max + 1."""
    dim = prefill.head_dim
    keys = prefill.key[:, sinks:].repeat_interleave(prefill.groups, dim=0)  # (H, L − sinks, d)
    logits = (mean[:, None, :] @ keys.transpose(1, 2))[:, 0] / math.sqrt(dim)
    logits = logits + torch.einsum("hnd,hde,hne->hn", keys, covariance, keys) / dim / 2
    attention = prefill.group_mean(torch.softmax(logits, dim=-1))  # (H_kv, L − sinks)
    scores = (attention + epsilon) * prefill.value[:, sinks:].norm(dim=-1) if use_vnorm else attention
    return functional.pad(scores, (sinks, 0), value=scores.max().item() + 1)


@register
class ExpectedAttention(ScorerPress):
    """Expected Attention: the attention the next FUTURE queries are expected to pay each key, from the mean and
    covariance of the context's pre-RoPE queries rotated to those positions, weighted by the value norm; the first
    SINKS tokens kept (see the module docstring)."""

    name, summary = "expected_attention", "the keys future queries are expected to attend to"
    peer = "ExpectedAttentionPress"
    needs_rope = True
    reads = ("query_pre",)
    min_context = 5  # more than its sinks
    #: kvpress's keyword arguments it takes (EPSILON and the value-norm weighting, as literals for the registry)
    fields = {"epsilon": 0.0, "use_vnorm": True}
    epsilon, use_vnorm = EPSILON, True

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        return remembered(prefill, self, lambda: expected_scores(prefill, epsilon=self.epsilon,
                                                                 use_vnorm=self.use_vnorm))  # the same at every ratio
