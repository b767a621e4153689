"""A tiny GGUF file for the model cache's tests: a 2-layer Llama with grouped-query attention, its matrices quantized
(Q4_1, as SmolLM2's file; Q8_0 for the embedding), its norms in float32 and a byte-level BPE vocabulary, written with
the gguf package's own writer so that transformers reads it exactly as it reads llama.cpp's files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tiny

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128


def _vocabulary() -> tuple[list[str], list[str]]:
    """(tokens, merges) of a byte-level BPE trained on the tiny corpus: what a GGUF's tokenizer.ggml.* holds."""
    from tokenizers import ByteLevelBPETokenizer

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(tiny.corpus_lines(300), vocab_size=300, special_tokens=["<|endoftext|>"],
                                show_progress=False)
    vocab = trained.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    import json

    merges = json.loads(trained._tokenizer.to_str())["model"]["merges"]
    return tokens, [" ".join(merge) if isinstance(merge, list) else merge for merge in merges]


def write_gguf(path: Path, seed: int = 0, architecture: str = "llama") -> Path:
    """A tiny Llama GGUF at `path` (the file), its weights drawn from `seed` with a spread (0.3) that makes attention
    peaked and the quantization's rounding visible; `architecture` names another in its header (one transformers
    does not know, for the refusals)."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    tokens, merges = _vocabulary()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if token == "<|endoftext|>" else gguf.TokenType.NORMAL
                            for token in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)

    def matrix(name: str, rows: int, columns: int, kind=gguf.GGMLQuantizationType.Q4_1) -> None:
        weights = (rng.standard_normal((rows, columns)) * 0.3).astype(np.float32)
        writer.add_tensor(name, quantize(weights, kind), raw_dtype=kind)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), HIDDEN, gguf.GGMLQuantizationType.Q8_0)
    head_dim = HIDDEN // HEADS
    for layer in range(LAYERS):
        norm(f"blk.{layer}.attn_norm.weight")
        matrix(f"blk.{layer}.attn_q.weight", HEADS * head_dim, HIDDEN)
        matrix(f"blk.{layer}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        matrix(f"blk.{layer}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        matrix(f"blk.{layer}.attn_output.weight", HIDDEN, HEADS * head_dim)
        norm(f"blk.{layer}.ffn_norm.weight")
        matrix(f"blk.{layer}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{layer}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"blk.{layer}.ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
