"""`compactor` (Compactor, Chari & Van Durme 2025, arXiv:2507.08143): keep the tokens that are outliers of the key
cloud or that the context's own queries attend to, whichever way the attention looks — a leverage score blended with
a non-causal, chunked attention score.

Both scores skip the first SINKS_START and the last SINKS_END tokens (always kept); on the S = L − 12 tokens between:

- *leverage* (kvpress's LeverageScorePress, spectra's `leverage` on those tokens): per key/value head, the pre-RoPE
  keys centred over the S tokens, sketched on the right, X = (K − 1μᵀ)Φ with Φ ~ N(0, 1/48) of shape d × 48
  (float32), and ℓ_j = x_jᵀ(XᵀX + λI)⁻¹x_j with λ = 0.01 (a Cholesky factorisation, λ raised where it fails),
  clamped at 0;
- *non-causal attention* (kvpress's NonCausalAttnPress): the S post-RoPE queries and keys cut into chunks of CHUNK
  tokens; within a chunk every query attends to every key (no causal mask, no score scale: softmax(q·k) in float32),
  and a key's score is the attention its chunk's queries pay it, averaged over the key/value group, times ‖v_j‖,
  average-pooled over 3 neighbours (zero padding counted). The last chunk is padded as kvpress pads it: its missing
  queries score 0 against every key, its missing keys −1e-9, and their rows and columns enter the softmax and the
  sums (a quirk kept, so that the scores are kvpress's).

Each is z-scored over the whole layer (all heads, the unbiased standard deviation floored at 1e-6), and the score is
r·leverage + attention, the blend r being the compression ratio (kvpress's default, blending None); the sinks are
scored the maximum (ties with the best token are broken by topk). The top n_kept are kept per key/value head.

kvpress 0.5.5's CompactorPress is the peer at its defaults (sink_size_start 8, sink_size_end 4, chunk_size 256,
sketch_dimension 48, blending None). It draws Φ from torch's global generator at every layer, through its
LeverageScorePress; here Φ is `leverage`'s layer sketch, drawn from a CPU generator seeded by (run seed, sequence
index) and advanced layer by layer — layer ℓ's Φ is the (ℓ + 1)-th draw — which is what kvpress draws when
torch.manual_seed(`Leverage.seed_of(seed, index)`) precedes the prefill.
It reads the pre-RoPE queries (`reads = ("query_pre",)`) and keys and the model's RoPE (`needs_rope`).
"""

from __future__ import annotations

import torch
from torch.nn import functional

from .base import Prefill, ScorerPress, register
from .memo import remembered
from .leverage import layer_sketch, sketched_leverage, z_scored

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 33

#: kvpress's defaults: the first and the last tokens always kept, and the non-causal attention's chunk (the sketch's
#: width and ridge are leverage's)
SINKS_START, SINKS_END, CHUNK = 8, 4, 256


def chunked_attention(q: torch.Tensor, key: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """(H, S) the attention each key receives from the queries of its chunk of `chunk` tokens, q, key (H, S, d)
    post-RoPE: softmax(q·k) without causal mask or scale, in float32, over the chunk's keys; the last chunk padded
    (missing queries score 0 against every key, missing keys −1e-9, and both take part) as kvpress pads it."""
    heads, length, dim = q.shape
    padded = -(-length // chunk) * chunk
    missing = padded - length
    queries = functional.pad(q, (0, 0, 0, missing)).unflatten(1, (-1, chunk))  # (H, chunks, c, d)
    keys = functional.pad(key, (0, 0, 0, missing)).unflatten(1, (-1, chunk))
    dots = queries @ keys.transpose(-1, -2)  # (H, chunks, c, c)
    if missing:
        absent = torch.arange(chunk, device=q.device) >= chunk - missing
        last = dots[:, -1]
        last.masked_fill_(absent[:, None], 0)
        last.masked_fill_(absent[None, :], -1e-9)
    return torch.softmax(dots.to(torch.float32), dim=-1).sum(dim=-2).flatten(1)[:, :length]


def compactor_scores(prefill: Prefill, blend: float, sketch: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """(H_kv, L) blend·z(leverage) + z(non-causal attention) on the tokens between the sinks, the sinks scored the
    maximum (see the module docstring); `sketch` (H_kv, d, k)."""
    return blended(blend, *compactor_parts(prefill, sketch, chunk))


def blended(blend: float, leverage: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """(H_kv, L) blend·leverage + attention (both z-scored, between the sinks), the sinks scored the maximum."""
    scores = blend * leverage + attention
    return functional.pad(scores, (SINKS_START, SINKS_END), value=scores.max().item())


def compactor_parts(prefill: Prefill, sketch: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(H_kv, S) each, z(leverage) and z(non-causal attention) on the S tokens between the sinks: what does not depend
    on the blend (the ratio), computed once per layer (`memo`)."""
    length = prefill.length
    if length <= SINKS_START + SINKS_END:
        raise ValueError(f"compactor needs more than {SINKS_START + SINKS_END} context tokens, got {length}")
    query_pre = prefill.read("query_pre")
    if prefill.rope is None or prefill.key_pre is None:
        raise ValueError("compactor reads the pre-RoPE keys and the model's RoPE, which this prefill did not keep (a "
                         "press reading them declares `needs_rope`)")
    inner = slice(SINKS_START, length - SINKS_END)
    cos, sin = prefill.rope(torch.arange(length, device=prefill.key.device))
    q = query_pre[:, inner]
    half = q.shape[-1] // 2
    q = q * cos[inner] + torch.cat([-q[..., half:], q[..., :half]], dim=-1) * sin[inner]
    keys = prefill.key[:, inner].repeat_interleave(prefill.groups, dim=0)
    attention = prefill.group_mean(chunked_attention(q, keys, chunk)) * prefill.value[:, inner].norm(dim=-1)
    attention = functional.avg_pool1d(attention[None], kernel_size=3, padding=1, stride=1)[0]
    leverage = sketched_leverage(prefill.key_pre[:, inner], sketch.to(prefill.key_pre.device))
    return z_scored(leverage), z_scored(attention)


@register
class Compactor(ScorerPress):
    """Compactor: the ratio-weighted z-scored sketched leverage of the pre-RoPE keys plus the z-scored non-causal
    chunked attention, the first 8 and last 4 tokens kept (see the module docstring)."""

    name, summary = "compactor", "key outliers (leverage) and keys the chunked context attends to, blended"
    peer = "CompactorPress"
    needs_rope = True
    reads = ("query_pre",)
    min_context = 13  # more than its sinks

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        parts = remembered(prefill, self, lambda: compactor_parts(prefill, layer_sketch(prefill)), "parts")
        return blended(ratio, *parts)
