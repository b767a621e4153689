"""The chunked prefill against the dense P: every layer's window rows, received attention, keys, values, window
queries and pre-RoPE keys equal what `continuation.from_captured` reads off one eager forward pass that forms P whole, for
chunks of one query, of a few and of the whole context; the layer outputs (hence the next layers' inputs) agree to
float rounding. Float64 tiny Llama with grouped-query attention, so the two routes agree to float64 rounding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spectra import capture, kernels, models
from spectra.errors import SpectraError
from spectra.kv import composition, continuation, passes, prefill
from spectra.kv.presses.base import WINDOW

import tiny

CONTEXT = 90


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "gqa-llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu", lm_head=True)
    loaded.model.double()
    ids = torch.randint(3, len(loaded.tokenizer), (CONTEXT,), generator=torch.Generator().manual_seed(1))
    return loaded, ids


def dense(loaded, ids) -> dict:
    """Each layer's prefill read off the dense P of one eager forward pass, with its pre-RoPE keys and queries."""
    found, pre = {}, {}

    def projection(layer, which, output):
        pre[layer, which] = output

    def observe(captured):
        key_pre = pre[captured.layer, "k"][0].unflatten(-1, (captured.key.shape[1], -1)).transpose(0, 1)
        found[captured.layer] = continuation.from_captured(captured, 0, CONTEXT, key_pre, 3, 5,
                                                           rope=models.rope(loaded.model),
                                                           reads=("received", "query_pre"),
                                                           hooked={"q": pre[captured.layer, "q"][0]})

    hooks = models.watch_projections(loaded.model, projection)
    capture.forward(loaded.model, loaded.layers, observe, None, [5], input_ids=ids[None])
    for handle in hooks:
        handle.remove()
    return found


@pytest.mark.parametrize("fused, chunk_bytes", [(False, 1), (False, 6 * CONTEXT * 8 * 7), (False, 2**30),
                                               (True, 2**30)], ids=["one-query", "seven", "whole", "fused"])
def test_chunked_prefill_equals_the_dense_p(gqa_llama, fused, chunk_bytes) -> None:
    loaded, ids = gqa_llama
    reference = dense(loaded, ids)
    got = prefill.exact(loaded.model, loaded.layers, ids, 3, 5, ("received", "query_pre"),
                        fused=fused, chunk_bytes=chunk_bytes)
    assert [p.layer for p in got] == list(range(loaded.layers))
    for layer, chunked in enumerate(got):
        want = reference[layer]
        for name in ("q", "key", "value", "key_pre", "query_pre", "window", "received"):
            a, b = ((chunked.read(name), want.read(name)) if name in passes.PASSES
                    else (getattr(chunked, name), getattr(want, name)))
            assert a.shape == b.shape, name
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), (layer, name)
        assert chunked.window.shape[1] == min(WINDOW, CONTEXT)
        assert torch.allclose(chunked.window.sum(-1), torch.ones(6, WINDOW, dtype=torch.float64), atol=1e-12)
        assert (chunked.scaling, chunked.seed, chunked.index) == (want.scaling, 3, 5)


def test_each_statistic_equals_eager_on_its_own() -> None:
    generator = torch.Generator().manual_seed(0)
    q, key, value = (torch.randn(shape, generator=generator, dtype=torch.float64)
                     for shape in ((4, 37, 8), (2, 37, 8), (2, 37, 8)))
    groups = 2
    scores = q @ key.repeat_interleave(groups, 0).transpose(-1, -2) * 0.3
    scores = scores.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = p @ value.repeat_interleave(groups, 0)
    assert torch.allclose(prefill.attention(q, key, value, 0.3), out, atol=1e-13)
    assert torch.allclose(kernels.window_rows(q[:, -10:], key, 0.3), p[:, -10:], atol=1e-13)
    assert torch.allclose(kernels.window_rows(q, key, 0.3), p, atol=1e-13)
    for chunk in (1, 5, 36, 37):
        assert torch.allclose(prefill.received_attention(q, key, 0.3, chunk), p.sum(-2), atol=1e-13)
    fused = prefill.fused_received(q, key, value, 0.3)
    assert fused is not None, "torch's CPU flash kernel is where the fused route expects it"
    assert torch.allclose(fused[0], out, atol=1e-12) and torch.allclose(fused[1], p.sum(-2), rtol=1e-12, atol=0)
    single = prefill.fused_received(q.float(), key.float(), value.float(), 0.3)
    assert torch.allclose(single[1], p.sum(-2).float(), rtol=1e-5, atol=0), "float32: relative error of rounding"


def test_the_queries_before_rope_turn_into_the_window_queries_by_the_models_rope(gqa_llama) -> None:
    """query_pre, kept only when a press reads it, rotated by `rope` at positions 0 … L − 1 (q·cos +
    rotate_half(q)·sin), gives the post-RoPE queries the prefill keeps for its window; so do the keys."""
    loaded, ids = gqa_llama
    without = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
    assert all(not layer.passes for layer in without)
    for layer in prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ("query_pre",)):
        assert layer.read("query_pre").shape == (6, CONTEXT, 8)
        cos, sin = layer.rope(torch.arange(CONTEXT))
        assert cos.shape == sin.shape == (CONTEXT, 8) and cos.dtype == torch.float64
        for pre, post in ((layer.read("query_pre"), layer.q), (layer.key_pre, layer.key)):
            turned = pre * cos + torch.cat([-pre[..., 4:], pre[..., :4]], dim=-1) * sin
            assert torch.allclose(turned[:, -post.shape[1]:], post, rtol=1e-12, atol=1e-12)


def test_without_received_the_statistic_is_absent_and_reading_it_fails_in_one_line(gqa_llama) -> None:
    """Reading nothing leaves `received` out, and a press reading it anyway is told which pass it lacks; a caller
    naming no reads gets it (exact's default)."""
    loaded, ids = gqa_llama
    got = prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
    reference = prefill.exact(loaded.model, loaded.layers, ids, 0, 0)
    for without, whole in zip(got, reference):
        assert not without.passes and whole.read("received").shape == (6, CONTEXT)
        assert torch.equal(without.window, whole.window) and torch.equal(without.key, whole.key)
        with pytest.raises(ValueError, match=r'lacks .received. .*reads = \("received",\)'):
            without.read("received")


def test_each_layer_carries_its_output_projection(gqa_llama) -> None:
    """criticalkv reads W^O: each layer's prefill holds its own attention's o_proj weight (D, H·d)."""
    loaded, ids = gqa_llama
    for layer, found in enumerate(prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())):
        own = loaded.model.model.layers[layer].self_attn.o_proj.weight
        assert found.w_o is not None and torch.equal(found.w_o, own)

def test_the_hidden_states_are_kept_only_when_asked_and_are_the_normed_layer_inputs(gqa_llama) -> None:
    """kvzap reads each layer's attention input (kvpress's `hidden_states`): the residual stream entering the decoder
    layer (transformers' output_hidden_states) through its input_layernorm; a prefill not asked keeps none."""
    loaded, ids = gqa_llama
    assert all(not layer.passes for layer in prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ()))
    with torch.inference_mode():
        residual = loaded.model(input_ids=ids[None], output_hidden_states=True).hidden_states
    for layer, found in enumerate(prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ("hidden",))):
        normed = loaded.model.model.layers[layer].input_layernorm(residual[layer][0])
        assert found.read("hidden").shape == (CONTEXT, 48)
        assert torch.allclose(found.read("hidden"), normed, rtol=1e-12, atol=1e-12), layer


def test_the_chunk_fits_its_budget() -> None:
    assert prefill.chunk_queries(9, 8192) == 2**27 // (9 * 8192 * 4)
    assert prefill.chunk_queries(9, 8192, budget=1) == 1
    assert prefill.chunk_queries(1, 10, budget=2**30) == 10


def test_a_pass_reading_the_repetition_prompts_is_refused_without_them(gqa_llama) -> None:
    """KVzip's and KVgrad's passes read the tokenizer's repetition prompts: asking for either without them is a
    programming error named at once, not an AttributeError deep in the pass."""
    loaded, ids = gqa_llama
    for reads in (("reconstruction",), ("gradient",)):
        with pytest.raises(ValueError, match="repetition"):
            prefill.exact(loaded.model, loaded.layers, ids, 0, 0, reads)


def test_a_qk_norm_model_s_keys_before_rope_rotate_into_its_cache() -> None:
    """Gemma 3 norms each head's queries and keys before RoPE: the keys before RoPE are the normed ones, so the
    model's own rotation (`models.rope`, a global layer's) turns them into the cached keys; every layer's prefill
    says its sliding window."""
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    model = tiny.gemma3(window=8, dtype=torch.float64)
    ids = torch.randint(3, 128, (24,), generator=torch.Generator().manual_seed(0))
    found = prefill.exact(model, 3, ids, 0, 0, ())
    assert [part.sliding_window for part in found] == [8, 8, None]
    cos, sin = models.rope(model)(torch.arange(24))
    rotated, _ = apply_rotary_pos_emb(found[2].key_pre, found[2].key_pre, cos, sin, unsqueeze_dim=0)
    torch.testing.assert_close(rotated, found[2].key, rtol=1e-12, atol=1e-12)



def test_a_local_layer_received_attention_within_its_window() -> None:
    """What a press reads of a local layer under --local-layers compress|kvpress: the attention each key received,
    Σ_i P_ij over the queries whose window holds key j (the band's column sums), against eager attention's weights
    from transformers' own model."""
    model = tiny.gemma3(window=8, dtype=torch.float64)
    eager = tiny.gemma3(window=8, dtype=torch.float64, attention="eager")
    ids = torch.randint(3, 128, (24,), generator=torch.Generator().manual_seed(0))
    found = prefill.exact(model, 3, ids, 0, 0, ("received",))
    with torch.no_grad():
        weights = eager(input_ids=ids[None], output_attentions=True).attentions
    for layer, part in enumerate(found):
        # eager takes its softmax in float32 whatever the dtype: its rounding bounds the agreement
        torch.testing.assert_close(part.read("received"), weights[layer][0].sum(dim=-2), rtol=1e-6, atol=1e-6)
    seen = []  # every layer's post-RoPE queries: without the window, the first layer's sums would differ
    capture.forward(model, 3, lambda captured: seen.append(captured.q[0]), None, [0], input_ids=ids[None],
                    use_cache=False)
    causal = prefill.received_attention(seen[0], found[0].key, found[0].scaling, 24)
    assert not torch.allclose(found[0].read("received"), causal)


def test_a_whole_model_pass_not_following_windows_is_refused_on_a_model_with_local_layers(monkeypatch) -> None:
    """Every whole-model pass follows sliding-window layers (`passes.Pass.windows`): asked of a tiny Gemma 3, the
    prefill hands every layer KVCompose's replay scores; a pass declared without windows is refused in one line
    naming it."""
    model = tiny.gemma3(window=8)
    ids = torch.randint(3, 128, (20,), generator=torch.Generator().manual_seed(4))
    assert passes.unwindowed(passes.PASSES) == []
    found = prefill.exact(model, 3, ids, 0, 0, ("composition",))
    torch.testing.assert_close(found[1].read("composition"), composition.scores(model, 3, ids, 0), rtol=0, atol=0)
    monkeypatch.setitem(passes.PASSES, "composition", dataclasses.replace(passes.PASSES["composition"], windows=False))
    with pytest.raises(SpectraError, match=r"^the whole-model passes \(KVCompose's replay pass\) do not follow"):
        prefill.exact(model, 3, ids, 0, 0, ("composition",))
