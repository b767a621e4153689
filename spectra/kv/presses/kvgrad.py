"""`kvgrad` (KVgrad, OpenReview cg1wTCJjjk): keep the cached pairs that most move the model's last hidden states
while it repeats the context — KVzip's reconstruction attention weighted by what the pair writes and by how much the
output depends on it (input × gradient attribution), query-agnostic, scored once per example for every ratio.

A heuristic read inside one layer (attention, key norms) cannot tell whether a pair's contribution survives to the
output; KVgrad estimates it. The model repeats its context after a prompt, as in KVzip, chunk by chunk; the
objective Φ = Σ_p ‖h_p‖² over the repeat's last hidden states is differentiated with respect to every layer's
attention output, and a cached pair scores the largest A · ‖v W^O‖ · ‖∂Φ/∂a‖ over its key/value head's query heads
and the repeat tokens — the engine's attribution pass (`spectra.kv.gradient`, which this press asks for by
declaring `reads = ("gradient",)`), whose scores of every layer reach each layer's `Prefill.gradient`. The attention sinks
(the first 4 positions) score above everything.

kvpress 0.5.5's KVgradPress is the peer, at its defaults (n_sink 4, chunk_size 512, `layerwise` off). Like its
parent KVzipPress, its ratio is shared by all layers: the int(N · r) lowest of all N = layers · H_kv · L scores are
evicted (ranked as `kvzip` ranks, `kvzip.pruned_counts` and `kvzip.kvzip_keep`), so heads and layers keep different
numbers of tokens; `layerwise=True` evicts int(H_kv · L · r) per layer. kvpress hides the evicted pairs from
attention with a fake key; here they are dropped (`presses.per_head`). kvpress does not use `n_kept`: its kept count
is what the global ranking leaves. The pass costs one forward and one backward pass per 512-token chunk.
"""

from __future__ import annotations

from .base import register
from .kvzip import KVzip

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 45


@register
class KVgrad(KVzip):
    """KVgrad: the pairs whose reconstruction attention, times what they write and the output's sensitivity to it,
    is largest, ranked across layers as `kvzip` ranks its own scores (see the module docstring); `layerwise` evicts
    the same share of every layer."""

    name, summary = "kvgrad", "the pairs that most move the last hidden states while the model repeats the context"
    peer = "KVgradPress"
    reads = ("gradient",)
