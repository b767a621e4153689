"""`spectra.kv.locallayers`: what a press does to a sliding-window layer under `--local-layers keep|compress|kvpress`
— which rows each layer keeps, the bytes it stores, and the greedy answers — against an independent computation:
transformers' own Gemma 3 (eager attention) with the press written into its cache by forward hooks, as kvpress 0.5.5
writes it, and each layer's attention mask written out by hand (kvpress's pipeline: the rows counted from layer 0's
length, as transformers 5.2 builds the mask; compress: each row's position within the window)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.nn import functional

import tiny
from spectra.config import LocalLayers
from spectra.kv import batching, locallayers, prefill
from spectra.kv.generation import Request
from spectra.kv.cell import FULL, Cell
from spectra.kv.presses import REGISTRY

WINDOW, LAYERS, CONTEXT, QUESTION, NEW = 8, 3, 96, 5, 6
RATIO = 0.5


def n_kept(length: int, ratio: float) -> int:
    return max(1, int(length * (1 - ratio)))


def knorm(module, kwargs, keys: torch.Tensor) -> torch.Tensor:
    """kvpress's KnormPress score: −‖k‖ of the cached keys (1, H_kv, n)."""
    return -keys.float().norm(dim=-1)


def snapkv(module, kwargs, keys: torch.Tensor, window: int = 64, kernel: int = 5) -> torch.Tensor:
    """kvpress's SnapKVPress score, written from its source: the last `window` queries (q_proj, q_norm, the layer's
    rotary embedding) over every cached key, causal, softmax in float32; the window's own columns dropped, the mean
    over queries average-pooled, averaged over each key/value group; the window kept (max + 1)."""
    hidden = kwargs["hidden_states"][:, -window:]
    heads, dim = module.config.num_attention_heads, module.head_dim
    q = module.q_norm(module.q_proj(hidden).view(1, window, heads, dim).transpose(1, 2))
    cos, sin = (part[:, -window:] for part in kwargs["position_embeddings"])
    q = q * cos[:, None] + torch.cat([-q[..., dim // 2:], q[..., :dim // 2]], dim=-1) * sin[:, None]
    k = keys.repeat_interleave(heads // keys.shape[1], dim=1)
    length = keys.shape[2]
    scores = q @ k.transpose(-1, -2) / dim ** 0.5
    scores = scores + torch.full_like(scores, float("-inf")).triu(length - window + 1)
    weights = scores.softmax(dim=-1, dtype=torch.float32)[..., :-window].mean(dim=2)
    pooled = functional.avg_pool1d(weights, kernel_size=kernel, padding=kernel // 2, stride=1)
    pooled = pooled.view(1, keys.shape[1], -1, length - window).mean(2)
    return functional.pad(pooled, (0, window), value=pooled.max().item() + 1)


def reference(eager, context: torch.Tensor, question: torch.Tensor, score, mode: LocalLayers) -> list[int]:
    """The greedy answer of transformers' own model to `question` after `context`, its cache compressed by hooks as
    kvpress compresses (`score`, topk's rows in topk's order, at RATIO) and decoded with masks written per layer:
    kvpress, every layer's whole cache compressed and the masks counting rows from layer 0's length (q_idx = m + i,
    kv_idx the row; local: q_idx − W < kv_idx ≤ q_idx); compress, a local layer's last W − 1 tokens compressed and each
    row seen by the queries whose window holds its position."""
    from transformers import DynamicCache

    cache, positions = DynamicCache(), {}
    length = context.shape[-1]

    def press(module, args, kwargs, output):
        local = module.sliding_window is not None and mode == LocalLayers.COMPRESS
        first = length - min(length, WINDOW - 1) if local else 0
        tiny.compress_layer(cache, module.layer_idx, first,
                            lambda keys: score(module, kwargs, keys).topk(n_kept(keys.shape[2], RATIO), dim=-1).indices,
                            positions)
        return output

    name = "cache" if "cache" in inspect.signature(eager.model.forward).parameters else "past_key_values"
    hooks = [layer.self_attn.register_forward_hook(press, with_kwargs=True) for layer in eager.model.layers]
    with torch.no_grad():
        eager.model(input_ids=context[None], **{name: cache})
        for hook in hooks:
            hook.remove()
        masked = tiny.window_mask(cache, positions, mode == LocalLayers.KVPRESS, WINDOW)
        hooks = [layer.self_attn.register_forward_pre_hook(masked, with_kwargs=True) for layer in eager.model.layers]
        produced, ids, at = [], question, length
        for _ in range(NEW):
            logits = eager(input_ids=ids[None], position_ids=torch.arange(at, at + ids.shape[-1])[None],
                           **{name: cache}).logits
            at += ids.shape[-1]
            produced.append(int(logits[0, -1].argmax()))
            ids = torch.tensor([produced[-1]])
    for hook in hooks:
        hook.remove()
    return produced


def spectra_cell(model, context: torch.Tensor, press: str, mode: LocalLayers, ratio: float = RATIO
                 ) -> tuple[Cell, list]:
    found = prefill.exact(model, LAYERS, context, 0, 0, ())
    cell = Cell(press, ratio, None if press == FULL else REGISTRY[press], context.shape[-1], 0, 0, mode)
    for layer in found:
        cell.compress(layer)
    return cell, found


def spectra_answer(model, context, question, press: str, mode: LocalLayers, strip: bool = False) -> list[int]:
    """spectra's greedy answer from the cell (`strip`: its local layers' windows reading the rows at their positions
    instead, what kvpress's pipeline does not do)."""
    cell, found = spectra_cell(model, context, press, mode)
    parts = [part if not strip else type(part)(part.kept, part.saved) for part in cell.parts]
    batch = batching.CacheBatch.of([parts], found, QUESTION + NEW)
    return batching.greedy_batch(model, LAYERS, batch, [Request(question, cell.start, NEW, set(), 0)])[0].ids


@pytest.fixture(scope="module")
def models():
    return (tiny.gemma3(window=WINDOW, layers=LAYERS, kv_heads=2),
            tiny.gemma3(window=WINDOW, layers=LAYERS, kv_heads=2, attention="eager"))


def examples(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    return [(torch.randint(3, 128, (CONTEXT,), generator=generator),
             torch.randint(3, 128, (QUESTION,), generator=generator)) for _ in range(count)]


@pytest.mark.parametrize("press, score", [("knorm", knorm), ("snapkv", snapkv)])
def test_kvpress_mode_answers_as_kvpress_pipeline_decodes(models, press, score) -> None:
    """`--local-layers kvpress`: every layer compressed from the whole context, topk's rows in topk's order, local
    windows counting rows: the greedy answer equals transformers' own model decoding the cache kvpress's hooks leave,
    with the masks transformers 5.2 builds for it. Reading the rows at their positions instead parts from it."""
    model, eager = models
    stripped = 0
    for context, question in examples(3):
        want = reference(eager, context, question, score, LocalLayers.KVPRESS)
        assert spectra_answer(model, context, question, press, LocalLayers.KVPRESS) == want
        stripped += spectra_answer(model, context, question, press, LocalLayers.KVPRESS, strip=True) != want
    assert stripped  # the test can fail: the row numbering matters to these answers


def test_compress_mode_answers_as_a_window_of_positions(models) -> None:
    """`--local-layers compress`: a local layer's last W − 1 tokens compressed at the ratio (per key/value head), each
    kept row seen by the queries whose window holds its position: the same greedy answer as transformers' model with
    that cache and those masks."""
    model, eager = models
    for context, question in examples(3):
        want = reference(eager, context, question, knorm, LocalLayers.COMPRESS)
        assert spectra_answer(model, context, question, "knorm", LocalLayers.COMPRESS) == want


def test_which_rows_each_mode_keeps_and_the_bytes_it_counts(models) -> None:
    """Per layer: keep leaves a local layer its last W − 1 tokens whatever the press; compress keeps n_kept(W − 1, r)
    of them, by the press' scores of those rows alone, per head; kvpress n_kept(L, r) of the whole context. The full
    cache's bytes are what each layer stores: the window (keep, compress), the whole context (kvpress)."""
    model, _ = models
    context, _ = examples(1)[0]
    row = 2 * (16 + 16) * 4  # two key/value heads, key + value of 16 float32
    held = WINDOW - 1
    window = torch.arange(CONTEXT - held, CONTEXT)
    for mode in LocalLayers:
        cell, found = spectra_cell(model, context, "knorm", mode)
        full, _ = spectra_cell(model, context, FULL, mode)
        for layer, (part, whole) in enumerate(zip(cell.parts, full.parts)):
            local = found[layer].sliding_window is not None
            assert (found[layer].sliding_window is None) == (layer == LAYERS - 1)
            key = found[layer].key.float()
            if not local or mode == LocalLayers.KVPRESS:  # the whole context, as a global layer
                expect = (-key.norm(dim=-1)).topk(n_kept(CONTEXT, RATIO), dim=-1).indices
            elif mode == LocalLayers.KEEP:
                expect = window.expand(2, -1)
            else:  # the window's rows, scored alone
                expect = (-key[:, -held:].norm(dim=-1)).topk(n_kept(held, RATIO), dim=-1).indices + CONTEXT - held
            assert torch.equal(part.kept.sort(dim=-1).values, expect.sort(dim=-1).values), (mode, layer)
            stored = (CONTEXT if not local or mode == LocalLayers.KVPRESS else held) * row
            assert int(whole.memory(found[layer]).sum()) == stored
            assert int(cell.memory(layer).sum()) == expect.shape[-1] * row
        assert full.full_bytes() == full.bytes() == cell.full_bytes()
        if mode == LocalLayers.COMPRESS:  # the heads keep different rows of the window
            assert not torch.equal(cell.parts[0].kept[0], cell.parts[0].kept[1])


def test_held_is_the_local_layer_as_its_cache_holds_it(models) -> None:
    """`held`: the last W − 1 keys, values, pre-RoPE keys, received attention (within the window) and attention
    inputs, and at most that many last queries; a global-layer-sized press then scores those rows only."""
    model, _ = models
    context, _ = examples(1)[0]
    found = prefill.exact(model, LAYERS, context, 0, 0, ("received", "hidden"))
    layer = found[0]
    part = locallayers.held(layer)
    assert part.length == WINDOW - 1 and part.q.shape[1] == WINDOW - 1
    for name in ("key", "value", "key_pre"):
        assert torch.equal(getattr(part, name), getattr(layer, name)[:, -(WINDOW - 1):])
    assert torch.equal(part.read("received"), layer.read("received")[:, -(WINDOW - 1):])
    assert torch.equal(part.read("hidden"), layer.read("hidden")[-(WINDOW - 1):])
