"""The exact prefill of one long context in bounded memory: every layer's `presses.Prefill`, P never held whole.

A press reads, per layer, the post-RoPE queries of the last WINDOW context positions, the cached keys and values, the
keys before RoPE, the window's attention rows and the attention each key received (`presses.Prefill`). The NLL engine
reads the last two off a dense P of every layer (`continuation.from_captured`): at L = 8192 that is 2.4 GB per layer for a
9-head model, 72 GB for SmolLM2's 30 layers. Here one forward pass over the context runs with an attention that
computes, layer by layer,

- the layer's output with `scaled_dot_product_attention` (causal, grouped-query; the fused kernel on CPU and CUDA,
  which never forms P: kvpress's pipeline prefills with the same call);
- the window's rows: the last w = min(WINDOW, L) queries' scores over the L keys, masked causally, softmax in float32
  (or wider) — eager attention's operations in its order;
- the attention each key received, Σ_i P_ij, only when a press reads it (the prefill pass `received`, `received`
  here; kvpress's observed attention). On a CPU, by two passes of the fused flash kernel (`fused_received`: the layer's attention with its
  log-normalisers, then a reversed attention whose log-normalisers are the column sums), about 1.6 times one
  attention; elsewhere, or as the reference, in *query chunks*, each chunk forming its c × (its last position + 1)
  causal scores and softmax and adding its column sums, so a layer holds c·L scores at a time (`CHUNK_BYTES`).

What a run's presses read beyond the cache are prefill passes (`kv.passes`: `reads`, their names), and the prefill
computes only those: the layer passes inside the forward pass (`passes.computed`), the whole-model passes — KVzip's
reconstruction, KVCompose's replay, KVgrad's attribution — after it, each once for every layer (`scored`). A press
reading a pass no press of the run declared fails in one line (`Prefill.read`) instead of reading nothing.

What is kept per layer is O(L·d) (keys, values, pre-RoPE keys) plus the window's H × w × L rows — about 1.1 GB for
SmolLM2 at 8192 tokens — and, only for a press reading `query_pre`, the H × L × d pre-RoPE queries. Keys are never
repeated over the query heads of a key/value head: a chunk's queries are grouped per key/value head (H_kv, G·c, d).
Statistics equal those of the dense P up to float rounding (matrix products of another shape sum in another order;
`tests/test_prefill.py` bounds it). Causal decoders, one context at a time (no padding); a sliding-window layer
(`spectra.sliding`: Gemma 3's local layers) attends its window only, the attention its keys received too (in query
chunks); what a press does to it is `--local-layers`' (`kv.locallayers`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch

from .. import capture, models, sliding
from . import passes, reconstruction
from ..capture import Captured
from ..errors import SpectraError
from .presses import Prefill
from .presses.base import WINDOW
from ..kernels import softmax_dtype

#: bytes of one chunk's scores (H × c × L floats): the chunk's queries c are chosen to stay under it
CHUNK_BYTES = 2**27


def chunk_queries(heads: int, length: int, itemsize: int = 4, budget: int = CHUNK_BYTES) -> int:
    """The queries per chunk whose H × c × L scores fit in `budget` bytes (at least one, at most L)."""
    return max(1, min(length, budget // max(1, heads * length * itemsize)))


def received_attention(q: torch.Tensor, key: torch.Tensor, scaling: float, chunk: int,
                       window: int | None = None) -> torch.Tensor:
    """Σ_i P_ij (H, L): the causal attention each key received from the L queries q (H, L, d) over key (H_kv, L, d),
    in chunks of `chunk` queries (each forms only its c × (last position + 1) block); with a sliding `window`, each
    query attends its last W keys only (`sliding.band`), as a local layer does."""
    heads, length, dim = q.shape
    kv_heads = key.shape[0]
    received = torch.zeros(heads, length, dtype=q.dtype, device=q.device)
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        size = stop - start
        grouped = q[:, start:stop].reshape(kv_heads, -1, dim)  # (H_kv, G·c, d)
        scores = (torch.matmul(grouped, key[:, :stop].transpose(-1, -2)) * scaling).view(heads, size, stop)
        if window is None:
            hidden = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
            scores[..., start:].masked_fill_(hidden, torch.finfo(scores.dtype).min)
        else:
            positions = torch.arange(stop, device=q.device)
            scores.masked_fill_(~sliding.band(positions[start:], positions, window), torch.finfo(scores.dtype).min)
        p = torch.softmax(scores, dim=-1, dtype=softmax_dtype(scores.dtype)).to(q.dtype)
        received[:, :stop] += p.sum(dim=-2)
    return received


def fused_received(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(output (H, L, d), Σ_i P_ij (H, L)) by two passes of the CPU's fused flash-attention kernel, or None where it
    is not available (another device, another torch).

    The first pass is the layer's causal attention, which also returns each query's log-normaliser
    lse_i = log Σ_j exp(s_ij), s_ij = q_i·k_j · s. Then Σ_i P_ij = Σ_{i ≥ j} exp(s_ij − lse_i) is the normaliser of a
    *reversed* attention in which key j is the query and the queries i ≥ j are its keys, each shifted by −lse_i: the
    shift rides in one extra dimension ([k_j, 1] · [q_i, −lse_i / s] · s = s_ij − lse_i), and the sequence is flipped
    so that "i ≥ j" is the kernel's causal mask. Its log-normaliser is log Σ_i P_ij. Two fused passes, no L × L
    matrix anywhere."""
    kernel = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if kernel is None or q.device.type != "cpu":
        return None
    groups = q.shape[0] // key.shape[0]
    keys = key.repeat_interleave(groups, dim=0)[None]
    try:
        out, lse = kernel(q[None], keys, value.repeat_interleave(groups, dim=0)[None], 0.0, True, scale=scaling)
        shifted_keys = torch.cat([q[None], (-lse / scaling)[..., None].to(q.dtype)], dim=-1).flip(2)
        queries = torch.cat([keys, torch.ones_like(keys[..., :1])], dim=-1).flip(2)
        _, reverse = kernel(queries, shifted_keys, torch.zeros_like(queries), 0.0, True, scale=scaling)
    except RuntimeError:  # a kernel that refuses these shapes or dtypes: the chunked route
        return None
    return out[0], reverse[0].flip(-1).exp().to(q.dtype)


def received(seen: passes.Seen) -> torch.Tensor:
    """The prefill pass `received` (H, L) of one layer: the column sums of its dense P where the forward pass formed
    it (the NLL protocol), else by the fused kernel where there is one (its attention output handed on as
    `seen.output`), else in query chunks; a sliding-window layer's within its window."""
    if seen.p is not None:
        return seen.p.sum(dim=-2)
    q = seen.q
    if seen.window is None and seen.fused and (fused := fused_received(q, seen.key, seen.value, seen.scaling)):
        seen.output = fused[0][None]
        return fused[1]
    chunk = chunk_queries(q.shape[0], q.shape[1], torch.finfo(softmax_dtype(q.dtype)).bits // 8, seen.chunk_bytes)
    return received_attention(q, seen.key, seen.scaling, chunk, seen.window)


def attention(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
              window: int | None = None) -> torch.Tensor:
    """Causal attention output (…, H, L, d) of q over key, value (…, H_kv, L, d) by the fused SDPA kernel; with a
    sliding `window` W, each query sees only its last W keys (`sliding.band`), as a local layer does."""
    gqa = q.shape[-3] != key.shape[-3]
    if window is None or window >= q.shape[-2]:
        return torch.nn.functional.scaled_dot_product_attention(q, key, value, is_causal=True, scale=scaling,
                                                                enable_gqa=gqa)
    positions = torch.arange(q.shape[-2], device=q.device)
    mask = sliding.band(positions, positions, window)
    return torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling,
                                                            enable_gqa=gqa)


@dataclass
class _Collector:
    """What the prefill's forward pass gathers, layer by layer."""

    window: int
    reads: tuple[str, ...]
    fused: bool
    chunk_bytes: int
    seed: int
    index: int
    w_o: dict[int, torch.Tensor] = field(default_factory=dict)
    rope: models.Rope | None = None
    windows: list[int | None] = field(default_factory=list)  # each layer's sliding window (`sliding.windows`)
    prefills: dict[int, Prefill] = field(default_factory=dict)
    pre_rope: dict[int, torch.Tensor] = field(default_factory=dict)
    hooked: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # what a read pass needs ("q", "input")

    def attention_input(self, layer: int, hidden: torch.Tensor) -> None:
        self.hooked.setdefault(layer, {})["input"] = hidden[0]

    def projection(self, layer: int, which: str, output: torch.Tensor) -> None:
        if which == "k":
            self.pre_rope[layer] = output
        elif which == "q" and passes.needed(self.reads, "q"):
            self.hooked.setdefault(layer, {})["q"] = output[0]

    def substitute(self, captured: Captured) -> torch.Tensor:
        """One layer: its output, and its `Prefill` kept."""
        q, key, value = captured.q[0], captured.key[0], captured.value[0]
        length = q.shape[1]
        window = min(self.window, length)
        q_window = q[:, length - window:].clone()
        local = self.windows[captured.layer] if self.windows else None
        banded = local is not None and local < length  # a sliding-window layer (what a press does to it: `locallayers`)
        seen = passes.Seen(q, key, value, captured.scaling, self.hooked.pop(captured.layer, {}), fused=self.fused,
                           chunk_bytes=self.chunk_bytes, window=local if banded else None)
        computed = passes.computed(self.reads, seen)
        pre = self.pre_rope.pop(captured.layer, None)  # (1, L, H_kv·d) → (H_kv, L, d)
        key_pre = None if pre is None else pre[0].unflatten(-1, (key.shape[0], -1)).transpose(0, 1)
        self.prefills[captured.layer] = Prefill(captured.layer, q_window, key, value, key_pre, None, captured.scaling,
                                                self.seed, self.index, w_o=self.w_o.get(captured.layer),
                                                rope=self.rope, sliding_window=local, passes=computed)
        if banded:
            return attention(q, key, value, captured.scaling, local)[None]
        return seen.output if seen.output is not None else attention(captured.q, captured.key, captured.value,
                                                                     captured.scaling)


def exact(model: torch.nn.Module, layers: int, ids: torch.Tensor, seed: int, index: int,
          reads: Iterable[str] = ("received",), *, fused: bool = True, window: int = WINDOW,
          chunk_bytes: int = CHUNK_BYTES, repetition: reconstruction.Repetition | None = None) -> list[Prefill]:
    """Every layer's exact prefill of the context `ids` (L,) at positions 0 … L − 1 (see the module docstring), with
    the prefill passes the run's presses read (`reads`, `kv.passes` names; by default the attention each key
    received, by the fused kernel where there is one, `fused`, else in query chunks) — the whole-model passes'
    scores by `scored` (`repetition`, the tokenizer's prompts, for the passes that need them). `seed` and `index`
    (the run's seed and the example's global index) go to the presses that draw randomly; each layer's output projection W^O goes with its prefill
    (`Prefill.w_o`). Every layer's `question_tokens` is 0: a task example's own count is set by its source
    (`TaskSource.run`)."""
    reads = tuple(reads)
    collector = _Collector(window, reads, fused, chunk_bytes, seed, index, models.output_projections(model),
                           models.rope(model), sliding.of_model(model))
    hooks = models.watch_projections(model, collector.projection) if models.rotary(model) or passes.needed(
        reads, "q") else []
    hooks += models.watch_inputs(model, collector.attention_input) if passes.needed(reads, "input") else []
    try:
        capture.forward(model, layers, None, collector.substitute, [index], input_ids=ids.reshape(1, -1),
                        use_cache=False, logits_to_keep=1)
    finally:
        for handle in hooks:
            handle.remove()
    found = [collector.prefills[layer] for layer in range(layers)]
    return scored(model, layers, found, ids, index, reads, repetition)


def scored(model: torch.nn.Module, layers: int, found: list[Prefill], ids: torch.Tensor, index: int,
           reads: Iterable[str], repetition: reconstruction.Repetition | None = None) -> list[Prefill]:
    """Every layer's prefill `found` of the context `ids` with the scores of the whole-model passes of `reads` (each
    run once for every layer, `passes.scored`) among its passes; `repetition`, the tokenizer's prompts, for those
    needing them."""
    whole = passes.whole_model_passes(reads)
    if not whole:
        return found
    names = ", ".join(entry.what for entry in whole)
    if any(part.sliding_window for part in found) and (unfollowed := passes.unwindowed(reads)):
        what = ", ".join(passes.PASSES[name].what for name in unfollowed)
        raise SpectraError(f"the whole-model passes ({what}) do not follow sliding-window layers yet: leave the "
                           "presses reading them out on this model")
    if repetition is None and passes.needed(reads, "repetition"):
        raise ValueError(f"the passes ({names}) read the tokenizer's repetition prompts: give `repetition`")
    computed = passes.scored(reads, passes.WholeModel(model, layers, found, ids.reshape(-1), index, repetition))
    return [replace(part, passes={**part.passes, **computed}) for part in found]
