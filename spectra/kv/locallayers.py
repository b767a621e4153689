"""What a press does to a sliding-window (local) layer: `--local-layers keep|compress|kvpress` of both studies,
`spectra evaluate` and `spectra cache` on text (whose continuation a local layer scores through its window too).

A local layer (Gemma 3's five of six, `spectra.sliding`) never holds more than its window: transformers' sliding-window
cache keeps the last W − 1 tokens after a prefill, all the next query may see (`sliding.kept`). Compressing it is
another question than compressing a global layer, so the task study asks it (`config.LocalLayers`):

- **keep** (the default): each local layer keeps its window as the model does, whatever the press (`window`); the
  press compresses the global layers only. The ratio is the share of the global layers' cache removed, and the bytes
  count what each layer really stores, a local layer its window (Gemma 3 270M at 1k tokens, r = 0.5: 0.86–0.88 of
  the full cache's bytes stored).
- **compress**: the press compresses each local layer too, from what it holds (`held`): it sees that layer's cache as
  the model keeps it, its last K = min(L, W − 1) tokens (their keys and values, the attention they received within
  the window, the last queries over them), and keeps what it keeps of K at the ratio (n_kept(K, r) for a scorer). So
  r is the share removed of what every layer holds and the bytes stored are ≈ 1 − r of the model's own cache (a local
  layer's full bytes are its window's). It is what kvpress's hooks would do on the cache transformers builds for the
  model itself (`DynamicCache(config=…)`, a sliding-window layer holding W − 1 tokens). While decoding, a local
  layer's query sees the kept rows whose positions lie within its window.
- **kvpress**: what kvpress 0.5.5's pipeline does on `Gemma3ForCausalLM` (transformers 5.2, the version it pins),
  bug and all, so that its answers can be compared (benchmarks/RESULTS.md §31):
  1. `BasePress.__call__` hooks every decoder layer; it skips the sliding-window ones (`self_attn.is_sliding`, with
     the warning "Compression in Gemma3 is only applied to layer without sliding window attention") only for
     `Gemma3ForConditionalGeneration`, not for `Gemma3ForCausalLM`, the class a text-only Gemma 3 (270M, 1B, a GGUF)
     loads as. KVzipPress refuses every `Gemma3PreTrainedModel`; DuoAttentionPress refuses the multimodal class only.
  2. Its pipeline prefills into `DynamicCache()` without a config, so every layer is a `DynamicLayer` holding the
     whole context (transformers makes `DynamicSlidingWindowLayer`s only from a config): a local layer's hook sees
     all L keys, and the press scores them as on a global layer (SnapKV's and TOVA's last queries over all L keys,
     causally, not through the window) and keeps n_kept(L, r), most of them beyond any window the model attends.
  3. A ScorerPress leaves its rows in `torch.topk`'s order (highest score first), not by position.
  4. While the question and the answer decode, Gemma 3 takes `cache_position` from layer 0's cache length, and layer 0
     is local: m rows, not L. The sliding-window mask (kv_idx > q_idx − W, kv_idx ≤ q_idx) then compares row
     indices with m + i: a local layer's query sees the last W rows of its cache (kept rows counted in topk's order,
     then the question's and answer's tokens), whatever their positions. Keys keep their RoPE positions and the
     question sits at L, L + 1, … (`position_ids`); the global layers' causal mask is unaffected (every kept row
     precedes the question).
  spectra reproduces that (`renumbered`): the full cache's local layers hold all L tokens (the model's own window
  applies: the answers are `keep`'s); a press's local layer keeps topk's rows in topk's order, and its window reads
  row r at position L − m + r (`Compressed.window_positions`). Bytes count what kvpress's cache holds: every layer
  the whole context, compressed at r.

Both `compress` and `kvpress` are refused (`kinds.pressbase`, before the model loads where its config tells) on a model
without local layers, and with presses whose effect on a local layer spectra does not reproduce: a press that
compresses while decoding (kvpress's DecodingPress would compress the local layers as it decodes, spectra's decoding
leaves them), one reading rotary positions (`Prefill.rope` is the global layers'; Gemma 3's local layers rotate with a
base of their own), the whole-model passes (kvzip, kvgrad and kvcompose run under `keep` only: each ranks
whole-context scores across the global layers, `kv.passes`), a press sharing one budget among every layer's heads
(`across_layers`: headbudget, whose budgets are the global layers' under keep);
`compress` also a press whose rows are not context tokens (linformer: a window reads positions), `kvpress` a press
that is no scorer (the row order above is kvpress's ScorerPress'). finch and key_rerotation move the kept keys to
positions 0 … m − 1 (`renumbers`), which a local layer's window cannot follow: refused on such a model in every mode.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .. import sliding
from ..config import LocalLayers
from .presses import Compressed, Prefill, Press, full
from .passes import PASSES
from .presses.base import ScorerPress, full_memory, n_kept, row_bytes


def window(prefill: Prefill) -> Compressed:
    """A sliding-window layer's cache as the model keeps it: its last W − 1 context tokens (`sliding.kept`); the press
    saves nothing there (`saved` 0), the model's window does."""
    count = sliding.kept(prefill.length, prefill.sliding_window)
    kept = torch.arange(prefill.length - count, prefill.length, device=prefill.key.device)
    return Compressed(kept.expand(prefill.kv_heads, -1), 0.0)


def held(prefill: Prefill) -> Prefill:
    """A local layer's prefill as its cache holds it: its last K = min(L, W − 1) tokens' keys, values, pre-RoPE keys,
    attention received (within the window) and attention inputs, and the last min(w, K) window queries (each of which
    sees all K); positions in it are 0 … K − 1 (`compressed` moves them back)."""
    count = sliding.kept(prefill.length, prefill.sliding_window)
    first = prefill.length - count

    def last(rows: torch.Tensor | None, dim: int = 1) -> torch.Tensor | None:
        return None if rows is None else rows.narrow(dim, first, count)

    return replace(prefill, q=prefill.q[:, -min(prefill.q.shape[1], count):], key=last(prefill.key),
                   value=last(prefill.value), key_pre=last(prefill.key_pre), window_rows=None,
                   passes={name: last(found, PASSES[name].tokens) for name, found in prefill.passes.items()})


def renumbered(press: ScorerPress, prefill: Prefill, ratio: float) -> Compressed:
    """kvpress's local layer (see the module docstring): the n_kept(L, r) rows `press` scores highest over the whole
    context, in torch.topk's order, its window reading row r at position L − m + r."""
    if not isinstance(press, ScorerPress):
        raise ValueError(f"{press.name} is no scorer: --local-layers kvpress reproduces scorers only")
    keep = n_kept(prefill.length, ratio)
    order = torch.topk(press.score(prefill, ratio), keep, dim=-1).indices
    at = torch.arange(prefill.length - keep, prefill.length, device=order.device).expand_as(order)
    return Compressed(order, 1.0 - keep / prefill.length, window_positions=at)


def compressed(prefill: Prefill, press: Press | None, ratio: float, mode: LocalLayers) -> Compressed:
    """The cache a local layer keeps under `mode` for `press` at `ratio` (None: the full cache's)."""
    if mode == LocalLayers.KVPRESS:
        return full(prefill) if press is None else renumbered(press, prefill, ratio)  # type: ignore[arg-type]
    if mode == LocalLayers.KEEP or press is None:
        return window(prefill)
    part = press.compress(held(prefill), ratio)
    if part.kept is None or part.start is not None:
        raise ValueError(f"{press.name} keeps no context positions: a local layer's window cannot read its rows")
    first = prefill.length - sliding.kept(prefill.length, prefill.sliding_window)
    return replace(part, kept=part.kept + first)


def whole(prefill: Prefill, mode: LocalLayers) -> int:
    """The bytes a local layer stores uncompressed, every key/value head: its window (keep, compress), or the whole
    context (kvpress, whose cache holds every token in every layer)."""
    if mode == LocalLayers.KVPRESS:
        return full_memory(prefill) * prefill.kv_heads
    return sliding.kept(prefill.length, prefill.sliding_window) * row_bytes(prefill) * prefill.kv_heads
