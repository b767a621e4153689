"""`cur` (CurDKV, Sengupta et al. 2025, arXiv:2509.15038): keep the tokens whose key *and* value rows weigh most in
their neighbourhood — the approximate leverage scores of a CUR decomposition of K and V.

A CUR decomposition keeps the rows of a matrix sampled by their leverage; CurDKV stands in for a row's leverage with
its squared norm (the sampling weight of norm-based CUR, and what a Gaussian sketch of the row keeps on average). Per
key/value head, token j's key and value get ‖k_j‖² and ‖v_j‖², each normalised by its sum over the token's local
window — the consecutive blocks of WINDOW tokens from the first, the last block shorter — so a token competes with
its neighbours, not with the whole context. Its score is the product of the two, normalised over the L tokens; the
first SINKS tokens are scored 1 (above any other: the scores sum to 1) and so always kept, and the top n_kept scores
are kept per key/value head.

kvpress 0.5.5's CURPress is the peer, at its defaults: num_sinks 4, leverage_type "kv_product", no random projection
(use_random_leverage False), the local approximation on with local_window_size 16; computed in the cache's dtype on
the cached (post-RoPE) keys and the values.
"""

from __future__ import annotations

import torch

from .base import Prefill, ScorerPress, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 32

#: kvpress's defaults: the first tokens always kept, and the block of tokens a leverage is normalised in
SINKS, WINDOW = 4, 16


def local_share(energy: torch.Tensor, window: int = WINDOW) -> torch.Tensor:
    """(…, L) each entry of `energy` (…, L) divided by the sum over its block of `window` consecutive tokens, blocks
    counted from the first token (the last one holds the L mod window tokens left, when there are any)."""
    length = energy.shape[-1]
    padded = torch.nn.functional.pad(energy, (0, -length % window))
    blocks = padded.unflatten(-1, (-1, window))
    return (blocks / blocks.sum(dim=-1, keepdim=True)).flatten(-2)[..., :length]


def cur_scores(key: torch.Tensor, value: torch.Tensor, sinks: int = SINKS, window: int = WINDOW) -> torch.Tensor:
    """(H_kv, L) the product of the keys' and values' local leverage shares, normalised over the L tokens, the first
    `sinks` scored 1, from `key`, `value` (H_kv, L, d)."""
    product = local_share(key.pow(2).sum(dim=-1), window) * local_share(value.pow(2).sum(dim=-1), window)
    scores = product / product.sum(dim=-1, keepdim=True)
    scores[:, :sinks] = 1.0
    return scores


@register
class CUR(ScorerPress):
    """CurDKV: the product of the key's and the value's squared norm, each a share of its 16-token block, the first
    SINKS tokens kept (see the module docstring)."""

    name, summary = "cur", "the keys and values of largest local leverage, as a CUR decomposition picks"
    peer = "CURPress"

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        return cur_scores(prefill.key, prefill.value)
