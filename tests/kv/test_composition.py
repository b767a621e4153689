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
