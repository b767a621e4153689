"""Eq. 7 against dense loops, sharing levels, padding, causal records refused, bias order, and use inside a model."""

from __future__ import annotations

import math

import pytest
import torch
from layers import attention_probs
from torch import nn
from transformers import AutoModel, BertConfig

from spectra import capture
from spectra.capture import Captured
from spectra.errors import SpectraError
from spectra.nn.linformer import LinformerSelfAttention, linear_attention, substitute
from spectra.nn.projections import Projections, jl_pair
from spectra.seeds import orthogonal_matrix
from spectra.sources import gaussian_qkv

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


pytestmark = pytest.mark.usefixtures("one_thread")


def dense_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """One head of eq. 7 for one sequence, plainly: softmax(q (E k)ᵀ / √d) (F v)."""
    scores = q @ (e @ k).T / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ (f @ v)


def dense_layer(x: torch.Tensor, module: LinformerSelfAttention, project_at: str) -> torch.Tensor:
    """Eq. 7 on hidden states with explicit loops over sequences and heads, then W^O."""
    batch, n, dim = x.shape
    heads, d = module.heads, dim // module.heads
    out = torch.zeros(batch, n, dim, dtype=x.dtype)
    for b in range(batch):
        concat = []
        for h in range(heads):
            rows = slice(h * d, (h + 1) * d)

            def linear(layer: nn.Linear, inp: torch.Tensor) -> torch.Tensor:
                y = inp @ layer.weight[rows].T
                return y if layer.bias is None else y + layer.bias[rows]

            e = module.projections.matrix(module.layer, h, "e")[:, :n] * module.projections.e_scale
            f = module.projections.matrix(module.layer, h, "f")[:, :n] * module.projections.f_scale
            q = linear(module.w_q, x[b])
            if project_at == "after":  # E (X W^K + b)
                head = dense_head(q, linear(module.w_k, x[b]), linear(module.w_v, x[b]), e, f)
            else:  # (E X) W^K + b, with identity "projections" on the compressed keys
                k_bar, v_bar = linear(module.w_k, e @ x[b]), linear(module.w_v, f @ x[b])
                eye = torch.eye(e.shape[0], dtype=x.dtype)
                head = dense_head(q, k_bar, v_bar, eye, eye)
            concat.append(head)
        out[b] = module.w_o(torch.cat(concat, dim=-1))
    return out


def valid_keys(lengths: list[int], n: int) -> torch.Tensor:
    """(B, n): True for the first `length` positions of each sequence."""
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("sharing", ["none", "headwise", "kv", "layerwise"])
@pytest.mark.parametrize("project_at", ["after", "before"])
def test_module_equals_dense_eq7(sharing, project_at) -> None:
    torch.manual_seed(0)
    projections = Projections(3, 4, budget=6, max_len=24, sharing=sharing, seed=1)
    module = LinformerSelfAttention(32, 4, projections, layer=2, project_at=project_at)
    x = torch.randn(2, 24, 32)
    with torch.no_grad():
        assert torch.allclose(module(x), dense_layer(x, module, project_at), atol=1e-5)


@pytest.mark.parametrize("sharing", ["none", "headwise", "kv", "layerwise"])
def test_linear_attention_on_projected_qkv_equals_dense(sharing) -> None:
    q, k, v = gaussian_qkv(20, 8, heads=3, batch=2, seed=3)
    e, f = jl_pair(sharing, 1, 3, budget=5, n=20, seed=4)
    got = linear_attention(q, k, v, e, f)
    for b in range(2):
        for h in range(3):
            assert torch.allclose(got[b, h], dense_head(q[b, h], k[b, h], v[b, h], e[h], f[h]), atol=1e-5)
    # scaling replaces 1/√d: scaling s equals the default on q · s√d
    s = 0.3
    assert torch.allclose(linear_attention(q, k, v, e, f, scaling=s),
                          linear_attention(q * s * math.sqrt(8), k, v, e, f), atol=1e-5)


def test_one_projections_object_shared_by_several_layers() -> None:
    projections = Projections(2, 2, 4, 16, "layerwise")
    model = nn.ModuleList([LinformerSelfAttention(8, 2, projections, layer) for layer in range(2)])
    assert len([name for name, _ in model.named_parameters() if "projections" in name]) == 1
    assert model[0].projections.matrix(0, 0, "e") is model[1].projections.matrix(1, 1, "f")


def test_k_equals_n_with_a_permutation_reproduces_exact_attention() -> None:
    # softmax commutes with permutations only: E = F = a permutation (orthogonal, RᵀR = I) is exact;
    # a general rotation is not (softmax(q kᵀ Rᵀ) R v ≠ softmax(q kᵀ) v).
    q, k, v = gaussian_qkv(16, 8, heads=2, batch=2, seed=0)
    exact = attention_probs(q, k) @ v
    perm = torch.eye(16)[torch.randperm(16, generator=torch.Generator().manual_seed(0))]
    assert torch.allclose(perm.T @ perm, torch.eye(16))
    assert torch.allclose(linear_attention(q, k, v, perm[None], perm[None]), exact, atol=1e-5)
    rotation = orthogonal_matrix(16, 16, seed=1)
    assert not torch.allclose(linear_attention(q, k, v, rotation[None], rotation[None]), exact, atol=1e-2)
    projections = Projections(1, 2, 16, 16, "kv", weights=torch.eye(16)[None])
    module = LinformerSelfAttention(16, 2, projections, w_o=nn.Identity())
    x = torch.randn(2, 16, 16)
    with torch.no_grad():
        standard = attention_probs(module._heads(module.w_q(x)), module._heads(module.w_k(x))) @ module._heads(module.w_v(x))
        assert torch.allclose(module(x), standard.transpose(1, 2).reshape(2, 16, 16), atol=1e-5)


def test_padded_batch_equals_each_sequence_alone() -> None:
    q, k, v = gaussian_qkv(20, 8, heads=2, batch=2, seed=7)
    e, f = jl_pair("headwise", 0, 2, 6, 20, seed=1)
    valid = valid_keys([20, 13], 20)
    batched = linear_attention(q, k, v, e, f, valid)
    alone = linear_attention(q[1:, :, :13], k[1:, :, :13], v[1:, :, :13], e, f)
    assert torch.allclose(batched[1, :, :13], alone[0], atol=1e-6)
    assert torch.allclose(batched[0], linear_attention(q[:1], k[:1], v[:1], e, f)[0], atol=1e-6)
    # padding contents do not matter
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 13:], v2[1, :, 13:] = 100.0, -100.0
    assert torch.allclose(linear_attention(q, k2, v2, e, f, valid), batched)

    torch.manual_seed(0)
    for project_at in ("after", "before"):
        module = LinformerSelfAttention(16, 2, Projections(1, 2, 6, 20, "none"), project_at=project_at)
        x = torch.randn(2, 20, 16)
        attention_mask = torch.ones(2, 20, dtype=torch.long)
        attention_mask[1, 13:] = 0
        with torch.no_grad():
            assert torch.allclose(module(x, attention_mask)[1, :13], module(x[1:, :13])[0], atol=1e-5)


def test_causal_records_are_refused() -> None:
    """Eq. 7 mixes every key into each projected key: substitute refuses a causal record (one line)."""
    q, k, v = gaussian_qkv(8, 4, seed=0)
    linformer = substitute(Projections(1, 1, 4, 8, "kv"))
    assert linformer(Captured.of(0, q, k, v)) is not None
    with pytest.raises(SpectraError, match="cannot be causal") as error:
        linformer(Captured.of(0, q, k, v, causal=True))
    assert "\n" not in str(error.value)
    assert substitute(Projections(1, 1, 4, 8, "kv"), layers=[1])(Captured.of(0, q, k, v, causal=True)) is None


def test_substitute_on_a_record_is_eq7_with_its_valid_keys_and_scale() -> None:
    q, k, v = gaussian_qkv(12, 4, heads=2, batch=2, seed=5)
    projections = Projections(2, 2, 5, 16, "none", seed=1)
    mask = torch.zeros(2, 1, 12, 12).masked_fill(~valid_keys([12, 9], 12)[:, None, None, :], torch.finfo(torch.float32).min)
    record = Captured.of(1, q, k, v, mask, scaling=0.8)
    got = substitute(projections, layers=[1])(record)
    e, f = projections.pair(1, 12)
    assert torch.equal(got, linear_attention(q, k, v, e, f, valid_keys([12, 9], 12), 0.8))
    assert substitute(projections, layers=[0])(record) is None
    with pytest.raises(SpectraError, match="built for 2"):
        substitute(projections)(Captured.of(0, q[:, :1], k[:, :1], v[:, :1]))


def test_bias_before_and_after_agree_only_without_bias() -> None:
    torch.manual_seed(0)
    projections = Projections(1, 2, 5, 12, "none", seed=3)
    after = LinformerSelfAttention(16, 2, projections, project_at="after")
    before = LinformerSelfAttention(16, 2, projections, project_at="before",
                                    w_q=after.w_q, w_k=after.w_k, w_v=after.w_v, w_o=after.w_o)
    x = torch.randn(2, 12, 16)
    with torch.no_grad():
        assert not torch.allclose(after(x), before(x), atol=1e-3)  # the (E 1 − 1) bᵀ term
        after.w_k.bias.zero_()
        after.w_v.bias.zero_()
        assert torch.allclose(after(x), before(x), atol=1e-5)
        unbiased = LinformerSelfAttention(16, 2, projections, bias=False, project_at="before")
        other = LinformerSelfAttention(16, 2, projections, project_at="after", w_q=unbiased.w_q, w_k=unbiased.w_k,
                                       w_v=unbiased.w_v, w_o=unbiased.w_o)
        assert torch.allclose(unbiased(x), other(x), atol=1e-5)


def test_bad_input() -> None:
    with pytest.raises(SpectraError, match="unknown project_at") as error:
        LinformerSelfAttention(8, 2, Projections(1, 2, 4, 8), project_at="middle")
    assert "\n" not in str(error.value)
    with pytest.raises(SpectraError, match="do not fit"):
        LinformerSelfAttention(8, 4, Projections(1, 2, 4, 8))
    with pytest.raises(SpectraError, match="not a multiple of heads"):
        LinformerSelfAttention(9, 2, Projections(1, 2, 4, 8))
    with pytest.raises(SpectraError, match="max_len ≥ 9"):
        linear_attention(*gaussian_qkv(9, 4), *jl_pair("kv", 0, 1, 4, 8))


@pytest.mark.parametrize("device", DEVICES)
def test_substitute_in_a_model_equals_the_standalone_layer(device) -> None:
    """The capture substitute (projected q, k, v) and the standalone layer on hidden states agree."""
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=24)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation=capture.NAME).to(device).eval()
    input_ids = torch.randint(5, 50, (2, 24), device=device)
    attention_mask = torch.ones(2, 24, dtype=torch.long, device=device)
    attention_mask[1, 15:] = 0
    projections = Projections(2, 2, budget=8, max_len=24, sharing="none", seed=0).to(device)
    seen = {}
    attention = model.encoder.layer[0].attention
    hook = attention.self.register_forward_hook(lambda module, args, out: seen.setdefault("heads", out[0]))
    with torch.no_grad():
        exact = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        seen.clear()
        with capture.capturing(substitute=substitute(projections, layers=[0])):
            approx = model(input_ids=input_ids, attention_mask=attention_mask)
        standalone = LinformerSelfAttention.from_pretrained(attention, projections, 0)
        assert standalone.w_q is attention.self.query and isinstance(standalone.w_o, nn.Linear)
        layer = standalone(exact.hidden_states[0], attention_mask)
        heads_only = LinformerSelfAttention.from_pretrained(attention.self, projections, 0)
        assert isinstance(heads_only.w_o, nn.Identity)
        heads = heads_only(exact.hidden_states[0], attention_mask)
    hook.remove()
    valid = attention_mask.bool()
    assert torch.allclose(seen["heads"][valid], heads[valid], atol=1e-5)
    assert torch.allclose(layer, attention.output.dense(heads), atol=1e-5)
    assert not torch.allclose(approx.last_hidden_state, exact.last_hidden_state, atol=1e-3)
