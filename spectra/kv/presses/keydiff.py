"""`keydiff` (KeyDiff, Park et al. 2025, arXiv:2504.15364): keep the keys least like the context's average key
direction — the distinctive ones — and evict those that point where most keys point.

Per key/value head, each cached (post-RoPE) key k_j is scaled to unit length, u_j = k_j / max(‖k_j‖, 1e-12), and
their mean over the L context tokens is the anchor a = (1/L) Σ_j u_j. Token j's score is minus its cosine with the
anchor, s_j = −k_j·a / (‖k_j‖ ‖a‖); the top n_kept scores are kept per key/value head. The anchor averages
directions, not keys, so a few long keys do not steer it, and the score ignores each key's own length (unlike
knorm's −‖k‖).

kvpress 0.5.5's KeyDiffPress is the peer, at its defaults (it has no parameters but the ratio): the same score from
the cached keys, in the cache's dtype (no widening to float32, unlike its KnormPress), with torch's
`functional.normalize` (ε 1e-12) and `functional.cosine_similarity` (ε 1e-8), which are used here too so that both
sides rank float ties alike; n_kept is kvpress's `max(1, int(L·(1 − r)))`. The paper evicts block by block while
the context is prefilled; kvpress (and this press) score the whole prefilled context at once, and leave the paper's
iteration to a block-wise wrapper (kvpress's BlockPress).
"""

from __future__ import annotations

import torch
from torch.nn import functional

from .base import Prefill, ScorerPress, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 15


def keydiff_scores(keys: torch.Tensor) -> torch.Tensor:
    """(H_kv, L) minus the cosine of each key of `keys` (H_kv, L, d) with its head's anchor, the mean of the unit
    keys over the L tokens; in the keys' dtype."""
    anchor = functional.normalize(keys, p=2.0, dim=-1).mean(dim=-2, keepdim=True)  # (H_kv, 1, d)
    return -functional.cosine_similarity(keys, anchor, dim=-1)


@register
class KeyDiff(ScorerPress):
    """KeyDiff: score −cos(k_j, a) of the cached key with the mean unit key a of its head, computed as kvpress's
    KeyDiffPress computes it (see the module docstring)."""

    name, summary = "keydiff", "the keys least aligned with their head's mean key direction"
    peer = "KeyDiffPress"
    rowscorer = True

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        return keydiff_scores(prefill.key)
