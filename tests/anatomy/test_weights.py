"""Weight spectra: σ of W_QK and W_OV equal a numpy SVD of the D × D products, the key/value group of each query
head follows repeat_interleave (9 query heads on 3 key/value heads), and the linears are found in BERT and Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, LlamaConfig, LlamaModel

from spectra.capture import Captured
from spectra.anatomy.weights import attention_weights, group_of, head_spectra, product_sigma


def test_product_sigma_equals_the_svd_of_the_product() -> None:
    rng = np.random.default_rng(0)
    left, right = rng.standard_normal((20, 4)), rng.standard_normal((4, 20))
    full = np.linalg.svd(left @ right, compute_uv=False)
    np.testing.assert_allclose(product_sigma(left, right), full[:4], rtol=1e-10)
    assert np.all(full[4:] < 1e-10), "rank ≤ 4: the rest is zero"


def test_groups_follow_repeat_interleave_for_9_query_and_3_key_value_heads() -> None:
    np.testing.assert_array_equal(group_of(9, 3), [0, 0, 0, 1, 1, 1, 2, 2, 2])
    key = torch.randn(1, 3, 5, 2)
    captured = Captured.of(0, torch.randn(1, 9, 5, 2), key, key)
    for head, group in enumerate(group_of(9, 3)):
        assert torch.equal(captured.k[:, head], key[:, group]), "the group is the key/value head capture repeats"
    np.testing.assert_array_equal(group_of(4, 4), range(4))
    with pytest.raises(ValueError, match="cannot share"):
        group_of(9, 2)


@pytest.fixture(scope="module")
def llama_9_3():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=36, num_hidden_layers=2, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=8, max_position_embeddings=32, initializer_range=0.3)
    return LlamaModel(config).eval()


def test_head_spectra_equal_numpy_svds_of_the_products_under_gqa(llama_9_3) -> None:
    layers = attention_weights(llama_9_3)
    assert len(layers) == 2
    found = head_spectra(layers, 9, 3)
    d = 4
    for layer, attention in enumerate(module.self_attn for module in llama_9_3.layers):
        w_q, w_k = attention.q_proj.weight.detach().double().numpy(), attention.k_proj.weight.detach().double().numpy()
        w_v, w_o = attention.v_proj.weight.detach().double().numpy(), attention.o_proj.weight.detach().double().numpy()
        for head in range(9):
            group = head // 3
            qk = w_q[head * d:(head + 1) * d].T @ w_k[group * d:(group + 1) * d]
            ov = w_o[:, head * d:(head + 1) * d] @ w_v[group * d:(group + 1) * d]
            for name, product in (("qk", qk), ("ov", ov)):
                sigma = np.linalg.svd(product, compute_uv=False)[:d]
                np.testing.assert_allclose(found[f"{name}_sigma"][layer, head], sigma, rtol=1e-9)
                cum = np.cumsum(sigma) / sigma.sum()
                np.testing.assert_allclose(found[f"{name}_cum"][layer, head], cum, rtol=1e-9)
                assert found[f"{name}_rank90"][layer, head] == np.argmax(cum >= 0.9) + 1
                assert found[f"{name}_rank99"][layer, head] == np.argmax(cum >= 0.99) + 1


def test_the_linears_of_bert_are_found_with_their_output_bias(bert_dir) -> None:
    model = AutoModel.from_pretrained(bert_dir)
    layers = attention_weights(model)
    first = model.encoder.layer[0].attention
    assert len(layers) == 2
    np.testing.assert_array_equal(layers[0].w_q, first.self.query.weight.detach().double().numpy())
    np.testing.assert_array_equal(layers[0].w_o, first.output.dense.weight.detach().double().numpy())
    np.testing.assert_array_equal(layers[0].b_o, first.output.dense.bias.detach().double().numpy())
