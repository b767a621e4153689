"""KVCompose's replay pass against transformers' own eager attention: the weights a plain forward over the context
twice returns (`output_attentions`), its replay rows over the first L keys, maxed over the rows and averaged over
each key/value group — what kvpress 0.5.5's KVComposePress hook reads of its replay over the prefilled cache (the
same queries and keys: the cache holds exactly the forward's first L positions); and one layer's chunked scores
against numpy. Float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from spectra import models
from spectra.kv import composition, prefill
from spectra.kv.composition import replay_scores

import tiny

LENGTH = 40


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    """A tiny Llama (6 query heads over 2 key/value heads) saved once: spectra's load and transformers' eager one."""
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "gqa-llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu", lm_head=True)
    loaded.model.double()
    eager = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").double().eval()
    return loaded, eager


def test_the_pass_equals_the_eager_weights_of_the_context_read_twice(gqa_llama) -> None:
    loaded, eager = gqa_llama
    ids = torch.randint(3, len(loaded.tokenizer), (LENGTH,), generator=torch.Generator().manual_seed(1))
    got = composition.scores(loaded.model, loaded.layers, ids, 0, chunk=7)  # chunks not dividing L
    with torch.no_grad():
        weights = eager(input_ids=torch.cat([ids, ids])[None], output_attentions=True).attentions
    assert got.shape == (loaded.layers, 2, LENGTH) and got.dtype == torch.float64
    for layer, p in enumerate(weights):
        best = p[0, :, LENGTH:, :LENGTH].amax(dim=1)  # (H, L): the largest weight a replay row gives each key
        expected = best.view(2, 3, LENGTH).mean(dim=1)
        # transformers' eager softmax runs in float32 even for a float64 model (spectra's in float64): float32's
        # rounding bounds the difference
        torch.testing.assert_close(got[layer], expected, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(got[0], got[1]), "each layer its own"


def test_on_sliding_window_layers_the_pass_follows_the_models_own_eager_attention() -> None:
    """A tiny Gemma 3 whose local layers (window 8) come before a global one: the replay attends within each local
    layer's window, so every layer's scores equal the weights transformers' eager attention (its sliding-window mask)
    gives the context read twice, where attending the whole cache would not."""
    model = tiny.gemma3(window=8, dtype=torch.float64, kv_heads=2)
    eager = tiny.gemma3(window=8, dtype=torch.float64, kv_heads=2, attention="eager")
    ids = torch.randint(3, 128, (24,), generator=torch.Generator().manual_seed(5))
    got = composition.scores(model, 3, ids, 0, chunk=5)
    with torch.no_grad():
        weights = eager(input_ids=torch.cat([ids, ids])[None], output_attentions=True).attentions
    expected = torch.stack([p[0, :, 24:, :24].amax(dim=1).view(2, 2, 24).mean(dim=1) for p in weights])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)  # eager's float32 softmax bounds it
    assert (got[:2, :, :24 - 7] == 0).all() and (got[:2, :, 24 - 7:] > 0).all(), "a window sees the last W − 1"
    model.config.layer_types = ["full_attention"] * 3  # the pass now attends the whole cache in every layer
    unbanded = composition.scores(model, 3, ids, 0, chunk=5)
    for layer in range(3):
        assert not torch.allclose(unbanded[layer], expected[layer], rtol=1e-3), layer


def test_one_layers_scores_against_numpy() -> None:
    rng = np.random.default_rng(3)
    length, heads, kv_heads, dim = 9, 4, 2, 5
    q, key = rng.standard_normal((heads, 2 * length, dim)), rng.standard_normal((kv_heads, 2 * length, dim))
    scaling = 0.4
    expected = np.zeros((kv_heads, length))
    for head in range(heads):
        logits = q[head] @ key[head // 2].T * scaling  # (2L, 2L)
        logits[np.triu_indices(2 * length, 1)] = -np.inf
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        expected[head // 2] += p[length:, :length].max(axis=0) / 2
    for chunk in (1, 4, 9, 100):
        got = replay_scores(torch.from_numpy(q), torch.from_numpy(key), scaling, length, chunk)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-14)
    for window in (1, 3, 9, 30):  # replay row L + i sees the keys after L + i − W: the context's last W − 1 − i
        banded = np.zeros((kv_heads, length))
        for head in range(heads):
            logits = q[head] @ key[head // 2].T * scaling
            at = np.arange(2 * length)
            logits[(at[None] > at[:, None]) | (at[None] <= at[:, None] - window)] = -np.inf
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            banded[head // 2] += p[length:, :length].max(axis=0) / 2
        for chunk in (1, 4, 100):
            got = replay_scores(torch.from_numpy(q), torch.from_numpy(key), scaling, length, chunk, window)
            np.testing.assert_allclose(got.numpy(), banded, rtol=1e-12, atol=1e-14)


def test_the_prefill_hands_every_layer_the_same_scores_only_when_asked(gqa_llama) -> None:
    loaded, _ = gqa_llama
    ids = torch.randint(3, len(loaded.tokenizer), (30,), generator=torch.Generator().manual_seed(2))
    plain = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
    assert all(not part.passes for part in plain)
    asked = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ("composition",))
    assert all(part.read("composition") is asked[0].read("composition") and list(part.passes) == ["composition"]
               for part in asked)
    expected = composition.scores(loaded.model, loaded.layers, ids, 0)
    torch.testing.assert_close(asked[0].read("composition"), expected, rtol=0, atol=0)
