"""KVgrad's attribution pass against references written here: the value norms and one chunk's combination against
numpy loops over kvpress 0.5.5's formula, and the whole pass against plain causal forward passes over the context
followed by each chunk's repeat, differentiated by autograd through eager attention (the pass attends to the
prefilled cache exactly, so the repeat's attention outputs and their gradients are those of such a forward), the
weights and norms then combined in numpy, in float64."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from spectra import capture, models
from spectra.kv import gradient, prefill
from spectra.kv.reconstruction import SINKS, Repetition


import tiny


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    """A tiny Llama with 6 query heads over 2 key/value heads, in float64."""
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "gqa-llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu", lm_head=True)
    loaded.model.double()
    return loaded


def numpy_value_norms(w_o: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(H_kv, G, t): ‖W^O_h v‖ through query head h = kv · G + g, W^O_h its d columns."""
    kv_heads, length, dim = values.shape
    heads = w_o.shape[1] // dim
    groups = heads // kv_heads
    found = np.zeros((kv_heads, groups, length))
    for head in range(heads):
        block = w_o[:, head * dim:(head + 1) * dim]
        for t in range(length):
            found[head // groups, head % groups, t] = np.linalg.norm(block @ values[head // groups, t])
    return found


def numpy_weights(q, own, cached, start, stop) -> np.ndarray:
    """(H, n, stop − start): softmax over [sinks, chunk, own (causal)] / √d, the chunk's columns."""
    heads, n, dim = q.shape
    groups = heads // cached.shape[0]
    sink = min(SINKS, start)
    found = np.zeros((heads, n, stop - start))
    for head in range(heads):
        kv = head // groups
        keys = np.concatenate([cached[kv, :sink], cached[kv, start:stop], own[kv]])
        logits = q[head] @ keys.T / np.sqrt(dim)
        logits[:, -n:] = np.where(np.tril(np.ones((n, n), bool)), logits[:, -n:], -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        found[head] = (weights / weights.sum(-1, keepdims=True))[:, sink:sink + stop - start]
    return found


def numpy_attribution(weights: np.ndarray, norms: np.ndarray, grads: np.ndarray, kv_heads: int) -> np.ndarray:
    """(H_kv, t): max over the group's heads h and tokens p of weights[h, p, c] · norms[h, c] · grads[p]."""
    heads = weights.shape[0]
    groups = heads // kv_heads
    found = np.zeros((kv_heads, weights.shape[-1]))
    for head in range(heads):
        for p in range(weights.shape[1]):
            found[head // groups] = np.maximum(found[head // groups],
                                               weights[head, p] * norms[head] * grads[p])
    return found


def test_value_norms_equal_numpy() -> None:
    rng = np.random.default_rng(0)
    w_o, values = rng.standard_normal((20, 6 * 8)), rng.standard_normal((2, 7, 8))
    got = gradient.value_norms(torch.from_numpy(w_o), torch.from_numpy(values))
    expected = numpy_value_norms(w_o, values)
    np.testing.assert_allclose(got.numpy(), expected.reshape(2, 3, 7), rtol=1e-12)


def test_one_chunk_attribution_equals_numpy() -> None:
    rng = np.random.default_rng(1)
    weights, norms, grads = rng.uniform(size=(6, 5, 9)), rng.uniform(size=(6, 9)), rng.uniform(size=5)
    got = gradient.chunk_attribution(torch.from_numpy(weights).view(2, 3, 5, 9), torch.from_numpy(norms).view(2, 3, 9),
                                     torch.from_numpy(grads))
    np.testing.assert_allclose(got.numpy(), numpy_attribution(weights, norms, grads, 2), rtol=1e-12)


def dense_scores(loaded, ids: torch.Tensor, pieces: Repetition, chunk: int, kv_heads: int = 2) -> np.ndarray:
    """The pass's scores from one plain causal forward over context + repeat per chunk (the model's own mask: a
    sliding-window layer's window), differentiated by autograd: Φ = Σ ‖h‖² over the repeat's positions of the last
    decoder layer's output, its gradient with respect to each layer's attention output at those positions."""
    length = ids.shape[-1]
    decoder = loaded.model.get_decoder()
    found = np.zeros((loaded.layers, kv_heads, length))
    for start, stop, repeat in pieces.chunks(ids, chunk):
        seen, outputs, last = {}, {}, []

        def observe(captured, seen=seen):
            seen[captured.layer] = (captured.q[0, :, length:].detach().numpy(), captured.key[0].detach().numpy(),
                                    captured.value[0, :, :length].detach().numpy())

        def attended(module, args, output, outputs=outputs):
            output[0].retain_grad()
            outputs[module.layer_idx] = output[0]

        hooks = [layer.self_attn.register_forward_hook(attended) for layer in decoder.layers]
        hooks.append(decoder.layers[-1].register_forward_hook(lambda module, args, output: last.append(output)))
        try:
            with torch.enable_grad(), capture.capturing(observe, None, [0]):
                decoder(input_ids=torch.cat([ids, repeat])[None], use_cache=False)
                out = last[0][0] if isinstance(last[0], tuple) else last[0]
                out[:, length:].square().sum().backward()
        finally:
            for handle in hooks:
                handle.remove()
        for layer, (q, keys, values) in seen.items():
            weights = numpy_weights(q, keys[:, length:], keys[:, :length], start, stop)
            w_o = decoder.layers[layer].self_attn.o_proj.weight.detach().numpy()
            norms = numpy_value_norms(w_o, values[:, start:stop]).reshape(weights.shape[0], -1)
            grads = np.linalg.norm(outputs[layer].grad[0, length:].numpy(), axis=-1)
            found[layer, :, start:stop] = numpy_attribution(weights, norms, grads, kv_heads)
    loaded.model.zero_grad(set_to_none=True)
    found[..., :SINKS] = found.max() + 1
    return found


def test_the_pass_equals_differentiated_forwards_over_the_context_and_each_repeat(gqa_llama) -> None:
    loaded = gqa_llama
    ids = torch.randint(3, len(loaded.tokenizer), (40,), generator=torch.Generator().manual_seed(1))
    pieces = Repetition(6, torch.tensor([5, 6]), torch.tensor([7, 8, 9]), torch.tensor([10, 11]))
    prefills = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
    trainable = [parameter.requires_grad for parameter in loaded.model.parameters()]
    got = gradient.scores(loaded.model, loaded.layers, [part.key for part in prefills],
                          [part.value for part in prefills], ids, pieces, 0, chunk=16)
    assert [parameter.requires_grad for parameter in loaded.model.parameters()] == trainable
    assert all(parameter.grad is None for parameter in loaded.model.parameters()), "only activations differentiated"
    assert got.shape == (loaded.layers, 2, 40) and got.dtype == torch.float64 and not got.requires_grad
    np.testing.assert_allclose(got.numpy(), dense_scores(loaded, ids, pieces, 16), rtol=1e-9, atol=1e-12)
    assert (got[..., SINKS:6] == 0).all(), "the template's opening beyond the sinks is not scored"
    assert (got[..., 6:] > 0).all() and (got[..., :SINKS] > got[..., SINKS:].max()).all()


def test_on_sliding_window_layers_the_pass_follows_the_models_own_forward() -> None:
    """A tiny Gemma 3 whose local layers (window 8) come before a global one: the repeat attends within each local
    layer's window, so every layer's scores equal those of autograd through the model's own forward over context +
    repeat (its transformers mask), where attending the whole cache would give others."""
    model = tiny.gemma3(window=8, dtype=torch.float64, kv_heads=2)
    loaded = SimpleNamespace(model=model, layers=3)
    ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(3))
    pieces = Repetition(6, torch.tensor([5, 6]), torch.tensor([7, 8, 9]), torch.tensor([10, 11]))
    prefills = prefill.exact(model, 3, ids, 0, 0, ())
    keys, values = [part.key for part in prefills], [part.value for part in prefills]
    dense = dense_scores(loaded, ids, pieces, 16)
    got = gradient.scores(model, 3, keys, values, ids, pieces, 0, chunk=16)
    np.testing.assert_allclose(got.numpy(), dense, rtol=1e-9, atol=1e-12)
    model.config.layer_types = ["full_attention"] * 3  # the pass now attends the whole cache in every layer
    unbanded = gradient.scores(model, 3, keys, values, ids, pieces, 0, chunk=16)
    for layer in range(3):  # the gradients reach every layer through the local ones
        assert not np.allclose(unbanded[layer, :, SINKS:].numpy(), dense[layer, :, SINKS:], rtol=1e-6), layer


def test_the_pass_runs_after_a_prefill_made_in_inference_mode(gqa_llama) -> None:
    """The prefilled keys come from inference mode (capture.forward); the pass, called from inference mode too (as a
    run's loop may), still differentiates."""
    loaded = gqa_llama
    ids = torch.randint(3, len(loaded.tokenizer), (20,), generator=torch.Generator().manual_seed(2))
    pieces = Repetition.of(loaded.tokenizer)
    prefills = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
    with torch.inference_mode():
        inside = gradient.scores(loaded.model, loaded.layers, [part.key for part in prefills],
                                 [part.value for part in prefills], ids, pieces, 0)
    outside = gradient.scores(loaded.model, loaded.layers, [part.key for part in prefills],
                              [part.value for part in prefills], ids, pieces, 0)
    torch.testing.assert_close(inside, outside, rtol=0, atol=0)
