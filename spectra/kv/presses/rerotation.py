"""`key_rerotation(<scorer>)`: a scorer's eviction, then the kept keys renumbered to contiguous positions 0 … m − 1,
as kvpress 0.5.5's `KeyRerotationPress` does (the rerotation of StreamingLLM's sink cache, Xiao et al. 2023,
arXiv:2309.17453, and of FINCH, Corallo & Papotti 2024, TACL).

An eviction press keeps m of the L context tokens, and each kept key keeps the RoPE rotation of its original
position p_j: the question that follows sits at positions L, L + 1, …, as far from the kept keys as it was from the
whole context. Key rerotation instead turns the j-th kept key (in position order) to position j, so the cache reads
as a contiguous context of m tokens, and the question and answer are then decoded at positions m, m + 1, … — kvpress's
pipeline sets the context length to the compressed cache's length for this press (`cache.get_seq_length()`, m for
every layer: a scorer keeps n_kept tokens per head). Relative distances shrink to what they are within the kept
tokens alone, and the positions never exceed the cache's length (what a sink cache needs to stream past the model's
trained length).

kvpress rotates each cached (post-RoPE) key by R(j − p_j) with cos and sin built from the rotary module's inv_freq; the
same key is R(j) applied to the key before RoPE, which is how it is formed here: the kept keys before RoPE
(`Prefill.key_pre`) through the model's own rotation at positions 0 … m − 1 (`Prefill.rope`), exactly the key the
model would have cached at position j (with its RoPE scaling, which kvpress's inv_freq route leaves out). The two
agree up to float rounding. Values are gathered unchanged. The scorer, and its ratio, are the wrapped press's
(`key_rerotation(knorm)`, `key_rerotation(snapkv)`, …): kept count max(1, int(L · (1 − r))) per head, the top
scores as torch.topk picks them, in position order.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, ScorerPress, Wrapper, evict, n_kept, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 77


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotate-half: [x₁, x₂] → [−x₂, x₁] along the last dimension (the halves pair channel i with d/2 + i)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rerotated_keys(prefill: Prefill, kept: torch.Tensor) -> torch.Tensor:
    """(H_kv, m, d) the keys of the `kept` (H_kv, m) context positions, each row j rotated to position j: the keys
    before RoPE gathered and rotated by the model's RoPE at 0 … m − 1 (see the module docstring)."""
    if prefill.key_pre is None or prefill.rope is None:
        raise ValueError("key_rerotation reads the keys before RoPE and the model's RoPE, which this prefill did not "
                         "keep (a model with rotary positions, a press declaring `needs_rope`)")
    rows = prefill.key_pre.gather(1, kept[..., None].expand(-1, -1, prefill.key_pre.shape[-1]))
    cos, sin = prefill.rope(torch.arange(kept.shape[-1], device=kept.device))  # (m, d)
    return (rows * cos + rotate_half(rows) * sin).to(prefill.key.dtype)


@register
class KeyRerotation(Wrapper):
    """`key_rerotation(<scorer>)`: the scorer's kept tokens, their keys rotated to positions 0 … m − 1 and the
    continuation decoded from position m (see the module docstring)."""

    name, summary = "key_rerotation", "a scorer's tokens, their keys re-rotated to contiguous positions"
    guide = ("Key rerotation (kvpress's `KeyRerotationPress`) over any scorer ({scorers}): the scorer evicts as it "
             "would alone, then the j-th kept key is rotated by RoPE to position j, so the cache reads as a "
             "contiguous context of m tokens, and the question and its answer (or the continuation) are decoded at "
             "positions m, m + 1, … instead of L, L + 1, … . The ratio is the scorer's, the share of the cached "
             "tokens removed; the bytes are the scorer's at the same ratio. It needs a model with rotary positions "
             "and no input beyond the scorer's name.")
    wraps, peer = "scorer", "KeyRerotationPress"
    needs_rope, renumbers = True, True

    def __init__(self, inner: ScorerPress | None = None) -> None:
        super().__init__(inner)
        self.needs_rope = True  # the inner scorer's flags are taken, but the rotation always reads RoPE

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        evicted = evict(prefill, self.scores(prefill, ratio), n_kept(prefill.length, ratio))
        return Compressed(evicted.kept, evicted.saved, key=rerotated_keys(prefill, evicted.kept),
                          start=evicted.kept.shape[-1])
