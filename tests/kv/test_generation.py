"""Greedy decoding from a compressed cache against references computed here: from the full cache it equals
`model.generate` (greedy) on the context and question; from an evicted cache every token equals the argmax of one
dense forward pass over everything so far in which the question's and answer's queries do not see the evicted
context keys; kvpress's stopping rule; the question's attention on the needle equals the dense P's. Float64 tiny
Llama with grouped-query attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

from spectra import capture, models
from spectra.kv import generation, prefill
from spectra.kv.presses import REGISTRY, full, per_head

import tiny

CONTEXT, QUESTION, NEW = 80, 6, 7


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "gqa-llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu", lm_head=True)
    loaded.model.double()
    ids = torch.randint(3, len(loaded.tokenizer), (CONTEXT + QUESTION,), generator=torch.Generator().manual_seed(2))
    return loaded, ids, prefill.exact(loaded.model, loaded.layers, ids[:CONTEXT], 0, 0)


def decode(loaded, ids, prefills, parts, stop=(), needle=None, new=NEW):
    cache = generation.Buffers.of(parts, prefills, QUESTION + new)
    request = generation.Request(ids[CONTEXT:], CONTEXT, new, set(stop), 0, needle)
    return generation.greedy_alone(loaded.model, loaded.layers, cache, request)


def test_from_the_full_cache_it_is_model_generate(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    got = decode(loaded, ids, prefills, [full(p) for p in prefills])
    config = GenerationConfig(do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None,
                              pad_token_id=0)
    with torch.inference_mode():
        generated = loaded.model.generate(ids[None], generation_config=config)[0, CONTEXT + QUESTION:]
    assert got.ids == generated.tolist()


def masked_dense_tokens(loaded, ids, parts, count: int) -> list[int]:
    """Greedy tokens, each the argmax of a dense forward over context + question + tokens so far where queries after
    the context see of the context only the kept keys of their key/value head (float64 loops, no engine code)."""
    def substitute(captured):
        q, key, value = captured.q[0], captured.key[0], captured.value[0]
        part = parts[captured.layer]
        kept = [part.kept[kv] if part.valid is None else part.kept[kv][part.valid[kv]] for kv in range(key.shape[0])]
        groups, n = q.shape[0] // key.shape[0], q.shape[1]
        out = torch.zeros_like(q)
        for head in range(q.shape[0]):
            kv = head // groups
            for i in range(n):
                seen = torch.arange(i + 1) if i < CONTEXT else torch.cat([kept[kv], torch.arange(CONTEXT, i + 1)])
                weights = torch.softmax(key[kv, seen] @ q[head, i] * captured.scaling, dim=-1)
                out[head, i] = weights @ value[kv, seen]
        return out[None]

    tokens = ids.tolist()
    for _ in range(count):
        logits = capture.forward(loaded.model, loaded.layers, None, substitute, [0],
                                 input_ids=torch.tensor([tokens])).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens[len(ids):]


@pytest.mark.parametrize("press", ["knorm", "snapkv", "streaming"])
def test_from_an_evicted_cache_it_is_the_masked_dense_forward(gqa_llama, press) -> None:
    loaded, ids, prefills = gqa_llama
    parts = [REGISTRY[press].compress(p, 0.75) for p in prefills]
    got = decode(loaded, ids, prefills, parts)
    assert got.ids == masked_dense_tokens(loaded, ids, parts, NEW)


def test_per_head_counts_decode_as_the_masked_dense_forward(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    generator = torch.Generator().manual_seed(5)
    parts = []
    for layer, prefilled in enumerate(prefills):
        keep = torch.zeros(prefilled.kv_heads, CONTEXT, dtype=torch.bool)
        for head, count in enumerate((4 + 40 * layer, 50 - 30 * layer)):
            keep[head, torch.randperm(CONTEXT, generator=generator)[:count]] = True
        parts.append(per_head(prefilled, keep))
    assert all(part.valid is not None for part in parts)
    got = decode(loaded, ids, prefills, parts)
    assert got.ids == masked_dense_tokens(loaded, ids, parts, NEW)
    assert got.ids != decode(loaded, ids, prefills, [full(p) for p in prefills]).ids, "the masks changed nothing"


def test_kvpress_stopping_rule(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    whole = [full(p) for p in prefills]
    free = decode(loaded, ids, prefills, whole).ids
    assert decode(loaded, ids, prefills, whole, stop={free[2]}).ids == free[:free.index(free[2], 1) + 1]
    assert decode(loaded, ids, prefills, whole, stop={free[0]}).ids[0] == free[0], "the first token never stops"
    assert len(decode(loaded, ids, prefills, whole, new=1).ids) == 1


def test_the_question_attention_on_the_needle_is_the_dense_ps(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    needle = torch.tensor([3, 40, 41, 79])
    got = decode(loaded, ids, prefills, [full(p) for p in prefills], needle=needle, new=1).needle_mass
    rows = {}

    def observe(captured):
        rows[captured.layer] = captured.p[0, :, CONTEXT:CONTEXT + QUESTION]  # (H, n, L + n)

    capture.forward(loaded.model, loaded.layers, observe, None, [0], input_ids=ids[None])
    want = torch.stack([rows[layer][..., needle].sum(-1).mean(-1) for layer in range(loaded.layers)])
    assert got.shape == (loaded.layers, 6)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_a_cache_refuses_rows_beyond_its_room(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    cache = generation.Buffers.of([full(p) for p in prefills], prefills, 1)
    with pytest.raises(ValueError, match="holds 81 rows"):
        cache.extend(0, prefills[0].key[:, :2], prefills[0].value[:, :2])


def test_the_stop_tokens_are_the_generation_configs(gqa_llama) -> None:
    loaded, *_ = gqa_llama
    assert generation.stop_tokens(loaded.model) == {loaded.tokenizer.eos_token_id}


def test_the_presses_change_the_answer(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    whole = decode(loaded, ids, prefills, [full(p) for p in prefills]).ids
    changed = [press for press in ("knorm", "snapkv", "streaming")
               if decode(loaded, ids, prefills, [REGISTRY[press].compress(p, 0.75) for p in prefills]).ids != whole]
    assert changed, "no press changed the answer: the evicted-cache test would prove nothing"


# ---------------------------------------------------------------- compression while decoding (DecodingPress)


def reference_decoding(loaded, ids, scorer: str, interval: int, target, new: int, forced=None,
                       question: int = QUESTION, evicted=None):
    """kvpress's DecodingPress, written here without the engine: every step one dense float64 forward over all tokens
    so far in which query i of layer ℓ, key/value head h sees the positions ≤ i not evicted from (ℓ, h) before i's
    step; after the step, each layer whose step count reaches `interval` (or whose step held ≥ target tokens) keeps
    `target` of its surviving positions by the scorer (knorm: smallest ‖k‖; tova: the step's last query's attention
    over the survivors, mean over all query heads, itself always kept), ranked with numpy; `target` may be a function
    of the tokens seen so far (CompressionRatioDecodingPress's size, read at each step); `evicted`: the context
    positions each (layer, key/value head) dropped after the prefill (PrefillDecodingPress). Returns the greedy tokens
    (or, with `forced` tokens fed instead, the logits of each step's last position) and the compressions made."""
    heads, kv_heads = 6, 2
    groups = heads // kv_heads
    evicted = evicted or [[set() for _ in range(kv_heads)] for _ in range(loaded.layers)]
    snapshot: dict[int, list[list[set]]] = {}
    counts = [0] * loaded.layers
    tokens, out, compressions = ids.tolist(), [], 0
    steps = [list(range(CONTEXT, CONTEXT + question))]
    for step in range(new):
        for position in steps[-1]:
            snapshot[position] = [[set(s) for s in layer] for layer in evicted]
        seen: dict[int, tuple] = {}

        def substitute(captured):
            q, key, value = captured.q[0], captured.key[0], captured.value[0]
            layer, total = captured.layer, q.shape[1]
            out_rows = torch.zeros_like(q)
            for head in range(heads):
                kv = head // groups
                for i in range(total):
                    hidden = snapshot[i][layer][kv] if i >= CONTEXT else set()
                    visible = [j for j in range(i + 1) if j not in hidden]
                    weights = torch.softmax(key[kv, visible] @ q[head, i] * captured.scaling, dim=-1)
                    out_rows[head, i] = weights @ value[kv, visible]
            seen[layer] = (q, key, captured.scaling)
            return out_rows[None]

        logits = capture.forward(loaded.model, loaded.layers, None, substitute, [0],
                                 input_ids=torch.tensor([tokens])).logits[0, -1]
        size = target(len(tokens)) if callable(target) else target
        for layer in range(loaded.layers):
            counts[layer] += 1
            if counts[layer] < interval and len(steps[-1]) < size:
                continue
            counts[layer] = 0
            q, key, scaling = seen[layer]
            last = len(tokens) - 1
            for kv in range(kv_heads):
                alive = np.array([j for j in range(len(tokens)) if j not in evicted[layer][kv]])
                if len(alive) <= size:
                    continue
                if scorer == "knorm":
                    score = -np.linalg.norm(key[kv, alive].numpy(), axis=-1)
                else:
                    rows = [np.exp(s - s.max()) / np.exp(s - s.max()).sum() for s in
                            (key[h // groups, alive].numpy() @ q[h, last].numpy() * scaling for h in range(heads))]
                    score = np.mean(rows, axis=0)
                    score[alive == last] = np.inf
                keep = alive[np.argsort(-score, kind="stable")[:size]]
                evicted[layer][kv] |= set(alive.tolist()) - set(keep.tolist())
                compressions += layer == 0 and kv == 0
        token = int(logits.argmax()) if forced is None else int(forced[step])
        out.append(logits if forced is not None else token)
        tokens.append(token)
        steps.append([len(tokens) - 1])
    return out, compressions


def decode_during(loaded, ids, prefills, scorer: str, interval: int, target: int, new: int = NEW):
    press = REGISTRY[f"decoding({scorer})"].for_run(compression_interval=interval)
    cache = generation.Buffers.of([full(p) for p in prefills], prefills, QUESTION + new)
    recompression = generation.Recompression(press, target)
    request = generation.Request(ids[CONTEXT:], CONTEXT, new, set(), 0)
    got = generation.greedy_alone(loaded.model, loaded.layers, cache, request, recompression)
    return got.ids, recompression.compressions


@pytest.mark.parametrize("scorer,interval,target", [("knorm", 3, 20), ("tova", 2, 30), ("knorm", 2, 4)])
def test_compressing_while_decoding_is_the_dense_forward_that_hides_what_was_evicted(gqa_llama, scorer, interval,
                                                                                     target) -> None:
    """Several compressions during the answer (target 4 < the question's 6 tokens: its pass compresses too)."""
    loaded, ids, prefills = gqa_llama
    got, compressions = decode_during(loaded, ids, prefills, scorer, interval, target)
    want, expected = reference_decoding(loaded, ids, scorer, interval, target, NEW)
    assert compressions == expected >= 2
    assert got == want


def test_compressing_changes_the_answer_and_a_distant_interval_does_not(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    whole = decode(loaded, ids, prefills, [full(p) for p in prefills]).ids
    assert decode_during(loaded, ids, prefills, "knorm", 100, 20) == (whole, 0)
    assert any(decode_during(loaded, ids, prefills, scorer, 2, 4)[0] != whole for scorer in ("knorm", "tova"))


@pytest.mark.parametrize("scorer", ["knorm", "tova"])
def test_teacher_forced_logits_are_the_dense_forwards(gqa_llama, scorer) -> None:
    """The NLL protocol's continuation, one step per token, compressed every 3 tokens down to 20 rows."""
    loaded, ids, prefills = gqa_llama
    forced = torch.randint(3, len(loaded.tokenizer), (8,), generator=torch.Generator().manual_seed(5))
    tokens = torch.cat([ids[CONTEXT:CONTEXT + 1], forced])  # no question: the continuation follows the context
    press = REGISTRY[f"decoding({scorer})"].for_run(compression_interval=3)
    recompression = generation.Recompression(press, 20)
    cache = generation.Buffers.of([full(p) for p in prefills], prefills, len(tokens))
    logits, attended = generation.teacher_forced(loaded.model, loaded.layers, cache, tokens, CONTEXT, recompression, 0)
    want = reference_forced(loaded, ids[:CONTEXT], tokens, scorer, 3, 20)
    assert torch.allclose(logits, torch.stack(want), atol=1e-10, rtol=0)
    assert attended == [81, 82, 83, 21, 22, 23, 21, 22, 23]
    assert recompression.compressions == 3


def share(ratio: float):
    """CompressionRatioDecodingPress's size after S tokens seen, written here."""
    return lambda seen: max(1, int(seen * (1 - ratio)))


@pytest.mark.parametrize("scorer,interval,ratio", [("knorm", 3, 0.7), ("tova", 2, 0.6), ("knorm", 2, 0.95)])
def test_compressing_to_a_share_of_the_tokens_seen_is_the_dense_forward(gqa_llama, scorer, interval, ratio) -> None:
    """compression_ratio_decoding: the size grows with the text (at 0.95: 4 of the 86 tokens the question's pass
    ends with, fewer than its 6 tokens, so that pass compresses too)."""
    loaded, ids, prefills = gqa_llama
    press = REGISTRY[f"compression_ratio_decoding({scorer})"].for_run(compression_interval=interval)
    cache = generation.Buffers.of([full(p) for p in prefills], prefills, QUESTION + NEW)
    recompression = generation.Recompression(press, press.target(CONTEXT, ratio), ratio=ratio)
    request = generation.Request(ids[CONTEXT:], CONTEXT, NEW, set(), 0)
    got = generation.greedy_alone(loaded.model, loaded.layers, cache, request, recompression)
    want, expected = reference_decoding(loaded, ids, scorer, interval, share(ratio), NEW)
    assert recompression.compressions == expected >= 2
    assert got.ids == want


@pytest.mark.parametrize("scorer", ["knorm", "tova"])
def test_teacher_forced_logits_at_a_share_are_the_dense_forwards(gqa_llama, scorer) -> None:
    """The NLL protocol's continuation under compression_ratio_decoding at 0.75, compressed every 3 tokens to a
    quarter of the tokens seen (20 rows after 83 tokens, 21 after 86, 22 after 89)."""
    loaded, ids, prefills = gqa_llama
    forced = torch.randint(3, len(loaded.tokenizer), (8,), generator=torch.Generator().manual_seed(5))
    tokens = torch.cat([ids[CONTEXT:CONTEXT + 1], forced])
    press = REGISTRY[f"compression_ratio_decoding({scorer})"].for_run(compression_interval=3)
    recompression = generation.Recompression(press, press.target(CONTEXT, 0.75), ratio=0.75)
    cache = generation.Buffers.of([full(p) for p in prefills], prefills, len(tokens))
    logits, attended = generation.teacher_forced(loaded.model, loaded.layers, cache, tokens, CONTEXT, recompression, 0)
    want, _ = reference_decoding(loaded, torch.cat([ids[:CONTEXT], tokens[:1]]), scorer, 3, share(0.75), len(tokens),
                                 forced=list(tokens[1:].tolist()) + [0], question=1)
    assert torch.allclose(logits, torch.stack(want), atol=1e-10, rtol=0)
    assert attended == [81, 82, 83, 21, 22, 23, 22, 23, 24]
    assert recompression.compressions == 3


@pytest.mark.parametrize("scorer,interval,ratio", [("knorm", 3, 0.5), ("tova", 2, 0.7)])
def test_evicting_after_the_prefill_then_while_decoding_is_the_dense_forward(gqa_llama, scorer, interval,
                                                                             ratio) -> None:
    """prefill_decoding: the scorer's eviction after the prefill, then decoding(…) at that size."""
    loaded, ids, prefills = gqa_llama
    press = REGISTRY[f"prefill_decoding({scorer})"].for_run(compression_interval=interval)
    parts = [press.compress(p, ratio) for p in prefills]
    cache = generation.Buffers.of(parts, prefills, QUESTION + NEW)
    target = press.target(CONTEXT, ratio)
    recompression = generation.Recompression(press, target, ratio=ratio)
    request = generation.Request(ids[CONTEXT:], CONTEXT, NEW, set(), 0)
    got = generation.greedy_alone(loaded.model, loaded.layers, cache, request, recompression)
    dropped = [[set(range(CONTEXT)) - set(kept.tolist()) for kept in part.kept] for part in parts]
    assert all(len(heads) == CONTEXT - target for layer in dropped for heads in layer)
    want, expected = reference_decoding(loaded, ids, scorer, interval, target, NEW, evicted=dropped)
    assert recompression.compressions == expected >= 2
    assert got.ids == want


def reference_forced(loaded, context, tokens, scorer, interval, target):
    """`reference_decoding` with the question reduced to the first token (one step each, as the NLL protocol feeds
    them): the logits of every fed token."""
    out, _ = reference_decoding(loaded, torch.cat([context, tokens[:1]]), scorer, interval, target, len(tokens),
                                forced=list(tokens[1:].tolist()) + [0], question=1)
    return out


def test_a_cache_decoded_alone_on_sliding_window_layers_answers_as_generate() -> None:
    """`greedy_alone` over `Buffers` (the path of presses that compress while decoding) on a tiny Gemma 3: the full
    cache's local layers hold their window and each new token sees its own, so the answer is `model.generate`'s."""
    from spectra.kv import selfcheck
    from spectra.kv.cell import FULL, Cell

    model = tiny.gemma3(window=8, dtype=torch.float64)
    generator = torch.Generator().manual_seed(3)
    context, question = torch.randint(3, 128, (40,), generator=generator), torch.randint(3, 128, (5,),
                                                                                          generator=generator)
    prefills = prefill.exact(model, 3, context, 0, 0, ())
    cell = Cell(FULL, 0.0, None, 40, 0, 0)
    for part in prefills:
        cell.compress(part)
    assert [part.kept.shape[-1] for part in cell.parts] == [7, 7, 40]
    assert cell.full_bytes() == cell.bytes() == (7 + 7 + 40) * (16 + 16) * 8  # what each layer really stores
    request = generation.Request(question, 40, 12, set(), 0)
    decoded = generation.greedy_alone(model, 3, cell.buffers(prefills, 5 + 12), request)
    assert decoded.ids == selfcheck.generated(model, torch.cat([context, question]), 12)[0]
