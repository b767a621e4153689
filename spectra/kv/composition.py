"""KVCompose's replay pass (arXiv:2509.05165): the attention the context, read a second time
after its own prefilled cache, pays each cached pair — scored once per example for every layer.

kvpress 0.5.5's `KVComposePress` (its defaults: no prompt of its own, so the context itself is replayed) prefills the
L context tokens, then runs them again over that cache in eager attention (positions L … 2L − 1) and records, per
layer and query head, the largest weight any of those L replay queries gives each of the L cached keys (its
`agg_task="max"`), then the mean over the query heads of each key/value group (`agg_group="mean"`). The replayed
queries see the whole context before them, so a pair that some later reading of the text needs scores high even
where the prefill's own causal queries could not see far enough ahead to value it.

Here that is one forward pass over the context twice, 2L tokens: its first L positions compute exactly the prefill
kvpress's cache holds, and its replay rows' attention over the first L keys is what kvpress's hook reads (the softmax
over all 2L − (L − i) keys replay query i sees, eager attention's operations: scores · s, masked, softmax in float32
cast back). The layer's own output is SDPA's; the replay rows' weights are formed `CHUNK` queries at a time, so a
layer holds H × CHUNK × 2L scores, never the 2L × 2L matrix. A sliding-window layer (Gemma 3's local layers,
`spectra.sliding`) attends within its window, as the model's own forward over the context twice does (its output and
its replay rows' weights: replay query L + i sees the keys after L + i − W only, so the context's last W − 1 − i), and
the later layers' queries are the model's. The result, (layers, H_kv, L), goes to every layer's
`Prefill.read("composition")`; the `kvcompose` press allocates its budget across layers from it (across the global
layers on a model with local layers, which keep their windows).
"""

from __future__ import annotations

import torch

from .. import capture, sliding
from ..capture import Captured
from ..kernels import softmax_dtype

#: replay queries whose attention rows are formed at a time
CHUNK = 256


def replay_scores(q: torch.Tensor, key: torch.Tensor, scaling: float, length: int, chunk: int = CHUNK,
                  window: int | None = None) -> torch.Tensor:
    """(H_kv, L): per key/value head, the mean over its G query heads of the largest weight the replay queries
    q[:, L:] (H, 2L, d, post-RoPE) give each of the first L keys of `key` (H_kv, 2L, d), causally and, on a
    sliding-window layer, within its `window` (`sliding.band`); the group mean summed head by head and divided by G,
    as kvpress's mean aggregator sums. A window's replay queries from L + W − 1 on see no context key (weight 0):
    their rows are not formed."""
    heads, total, dim = q.shape
    kv_heads = key.shape[0]
    groups = heads // kv_heads
    best = q.new_full((heads, length), float("-inf"))
    seeing = total if window is None else min(total, length + max(window - 1, 1))
    for start in range(length, seeing, chunk):
        stop = min(start + chunk, seeing)
        rows = q[:, start:stop].reshape(kv_heads, groups * (stop - start), dim)
        scores = torch.matmul(rows, key[:, :stop].transpose(-1, -2)).view(heads, stop - start, stop) * scaling
        positions = torch.arange(stop, device=q.device)
        scores.masked_fill_(~sliding.band(positions[start:], positions, window), torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=softmax_dtype(scores.dtype)).to(q.dtype)
        best = torch.maximum(best, weights[..., :length].amax(dim=1))
    grouped = best.view(kv_heads, groups, length)
    summed = grouped[:, 0].clone()
    for member in range(1, groups):
        summed += grouped[:, member]
    return summed / groups


def scores(model: torch.nn.Module, layers: int, ids: torch.Tensor, index: int, chunk: int = CHUNK) -> torch.Tensor:
    """(layers, H_kv, L): every cached pair's replay score (see the module docstring) for the context `ids` (L,);
    `index` is the example's global index (the captured records carry it)."""
    length = ids.shape[-1]
    found: dict[int, torch.Tensor] = {}
    windows = sliding.of_model(model) or [None] * layers
    bands: dict[int, torch.Tensor] = {}  # a window's (2L, 2L) band, formed once for its layers

    def substitute(captured: Captured) -> torch.Tensor:
        window = windows[captured.layer]
        found[captured.layer] = replay_scores(captured.q[0], captured.key[0], captured.scaling, length, chunk, window)
        if window is not None and window not in bands:
            positions = torch.arange(2 * length, device=captured.q.device)
            bands[window] = sliding.band(positions, positions, window)
        allowed = None if window is None else bands[window]
        return torch.nn.functional.scaled_dot_product_attention(
            captured.q, captured.key, captured.value, attn_mask=allowed, is_causal=allowed is None,
            scale=captured.scaling, enable_gqa=captured.q.shape[-3] != captured.key.shape[-3])

    twice = torch.cat([ids.reshape(-1), ids.reshape(-1)])[None]
    capture.forward(model, layers, None, substitute, [index], input_ids=twice, use_cache=False, logits_to_keep=1)
    return torch.stack([found[layer] for layer in range(layers)])
