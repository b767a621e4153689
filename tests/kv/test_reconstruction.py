"""KVzip's reconstruction pass against references written here: the prompt pieces cut from a chat template as
kvpress 0.5.5 cuts them, the chunks and their prompts, one chunk's scores against numpy, and the whole pass against
plain causal forward passes over the context followed by each chunk's repeat (the pass attends to the prefilled
cache exactly, so its queries and keys are those of such a forward), in float64."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from spectra import capture, models
from spectra.kv import prefill, reconstruction
from spectra.kv.reconstruction import FIRST, LATER, SINKS, Repetition, chunk_scores

import tiny

TEMPLATE = ("{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    """A tiny Llama with 6 query heads over 2 key/value heads, in float64."""
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "gqa-llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu", lm_head=True)
    loaded.model.double()
    return loaded


def encoded(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_without_a_chat_template_nothing_is_prefix_and_a_newline_ends_the_prompt(llama_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    assert tokenizer.chat_template is None
    pieces = Repetition.of(tokenizer)
    assert pieces.prefix == 0 and pieces.suffix.tolist() == encoded(tokenizer, "\n")
    assert pieces.first.tolist() == encoded(tokenizer, FIRST) and pieces.later.tolist() == encoded(tokenizer, LATER)


def test_a_chat_template_is_cut_at_the_message(llama_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    tokenizer.chat_template = TEMPLATE
    pieces = Repetition.of(tokenizer)
    assert pieces.prefix == len(encoded(tokenizer, "<|user|>")) > 0
    assert pieces.suffix.tolist() == encoded(tokenizer, "<|end|><|assistant|>")


def test_chunks_quote_the_end_of_the_previous_chunk() -> None:
    pieces = Repetition(3, torch.tensor([90]), torch.tensor([80, 81]), torch.tensor([70]))
    ids = torch.arange(100, 130)
    found = pieces.chunks(ids, 10)
    assert [(start, stop) for start, stop, _ in found] == [(3, 13), (13, 23), (23, 30)]
    assert found[0][2].tolist() == [80, 81, 90, *range(103, 113)]
    assert found[1][2].tolist() == [70, *range(105, 113), 90, *range(113, 123)]  # the last 8 of chunk 0
    assert found[2][2].tolist() == [70, *range(115, 123), 90, *range(123, 130)]
    short = pieces.chunks(ids, 4)  # a chunk shorter than the quote quotes all of it
    assert short[1][2].tolist() == [70, *range(103, 107), 90, *range(107, 111)]
    assert pieces.chunks(ids[:3], 10) == [] and len(pieces.chunks(ids, 2048)) == 1
    on_meta = pieces.chunks(ids.to("meta"), 10)  # the prompts' ids (read on the CPU) join the context's device
    assert [repeat.device.type for _, _, repeat in on_meta] == ["meta"] * 3  # (an H100 run met a CPU/CUDA cat)


def numpy_chunk_scores(q, own, cached, start, stop) -> np.ndarray:
    """(H_kv, stop − start): max over a group's queries of softmax over [sinks, chunk, own (causal)] / √d."""
    heads, n, dim = q.shape
    groups = heads // cached.shape[0]
    sink = min(SINKS, start)
    found = np.zeros((cached.shape[0], stop - start))
    for head in range(heads):
        kv = head // groups
        keys = np.concatenate([cached[kv, :sink], cached[kv, start:stop], own[kv]])
        logits = q[head] @ keys.T / np.sqrt(dim)
        logits[:, -n:] = np.where(np.tril(np.ones((n, n), bool)), logits[:, -n:], -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        found[kv] = np.maximum(found[kv], weights[:, sink:sink + stop - start].max(0))
    return found


@pytest.mark.parametrize("start", [0, 2, 10])
def test_one_chunk_scores_equal_numpy(start: int) -> None:
    rng = np.random.default_rng(start)
    q, own, cached = rng.standard_normal((6, 5, 8)), rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 30, 8))
    got = chunk_scores(*(torch.from_numpy(array) for array in (q, own, cached)), start, start + 12)
    np.testing.assert_allclose(got.numpy(), numpy_chunk_scores(q, own, cached, start, start + 12), rtol=1e-12)


def dense_scores(loaded, ids: torch.Tensor, pieces: Repetition, chunk: int, kv_heads: int = 2) -> np.ndarray:
    """The pass's scores from one plain causal forward over context + repeat per chunk (captured q and keys)."""
    length = ids.shape[-1]
    found = np.zeros((loaded.layers, kv_heads, length))
    for start, stop, repeat in pieces.chunks(ids, chunk):
        seen = {}

        def observe(captured, seen=seen):
            seen[captured.layer] = (captured.q[0, :, length:].numpy(), captured.key[0].numpy())

        capture.forward(loaded.model, loaded.layers, observe, None, [0], input_ids=torch.cat([ids, repeat])[None])
        for layer, (q, keys) in seen.items():
            found[layer, :, start:stop] = numpy_chunk_scores(q, keys[:, length:], keys[:, :length], start, stop)
    found[..., :SINKS] = found.max() + 1
    return found


def test_the_pass_equals_forwards_over_the_context_and_each_repeat(gqa_llama) -> None:
    loaded = gqa_llama
    ids = torch.randint(3, len(loaded.tokenizer), (40,), generator=torch.Generator().manual_seed(1))
    pieces = Repetition(6, torch.tensor([5, 6]), torch.tensor([7, 8, 9]), torch.tensor([10, 11]))
    prefills = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
    got = reconstruction.scores(loaded.model, loaded.layers, [part.key for part in prefills],
                                [part.value for part in prefills], ids, pieces, 0, chunk=16)
    assert got.shape == (loaded.layers, 2, 40) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), dense_scores(loaded, ids, pieces, 16), rtol=1e-9, atol=1e-12)
    assert (got[..., SINKS:6] == 0).all(), "the template's opening beyond the sinks is not reconstructed"
    assert (got[..., 6:] > 0).all() and (got[..., :SINKS] > got[..., SINKS:].max()).all()


def test_on_sliding_window_layers_the_pass_follows_the_models_own_forward() -> None:
    """A tiny Gemma 3 whose local layers (window 8) come before a global one: the repeat attends within each local
    layer's window, so every layer's scores equal those of the model's own forward over context + repeat (its
    transformers mask), where attending the whole cache would not."""
    model = tiny.gemma3(window=8, dtype=torch.float64)
    loaded = SimpleNamespace(model=model, layers=3)
    ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(3))
    pieces = Repetition(6, torch.tensor([5, 6]), torch.tensor([7, 8, 9]), torch.tensor([10, 11]))
    prefills = prefill.exact(model, 3, ids, 0, 0, ())
    keys, values = [part.key for part in prefills], [part.value for part in prefills]
    dense = dense_scores(loaded, ids, pieces, 16, kv_heads=1)
    got = reconstruction.scores(model, 3, keys, values, ids, pieces, 0, chunk=16)
    np.testing.assert_allclose(got.numpy(), dense, rtol=1e-9, atol=1e-12)
    model.config.layer_types = ["full_attention"] * 3  # the pass now attends the whole cache in every layer
    unbanded = reconstruction.scores(model, 3, keys, values, ids, pieces, 0, chunk=16)
    model.config.layer_types = ["sliding_attention", "sliding_attention", "full_attention"]
    assert not np.allclose(unbanded[1:].numpy(), dense[1:], rtol=1e-6), "the window changes the later layers' scores"


def test_the_prefill_hands_every_layer_the_same_scores_only_when_asked(gqa_llama) -> None:
    loaded = gqa_llama
    ids = torch.randint(3, len(loaded.tokenizer), (30,), generator=torch.Generator().manual_seed(2))
    pieces = Repetition.of(loaded.tokenizer)
    plain = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
    assert all(not part.passes for part in plain)
    asked = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ("reconstruction",),
                          repetition=pieces)
    expected = reconstruction.scores(loaded.model, loaded.layers, [part.key for part in plain],
                                     [part.value for part in plain], ids, pieces, 0)
    assert all(part.read("reconstruction") is asked[0].read("reconstruction") for part in asked)
    torch.testing.assert_close(asked[0].read("reconstruction"), expected, rtol=0, atol=0)
