"""The paper's Table 3 on this machine: one attention layer's forward, Linformer against exact attention.

    python benchmarks/attention.py [--lengths 512,1024,2048,4096,8192,16384] [--budgets 64,128,256] [--tokens 16384] [--encoder]
                                   [--device cpu|cuda]

Compared on the same (B, H, n, d) = (tokens/n, 12, n, 64) q, k, v (a fixed number of tokens per batch,
one of the paper's two settings): eager attention softmax(q kᵀ/√d) v, PyTorch's fused
scaled_dot_product_attention, and the project's Linformer attention (spectra.nn.linformer.linear_attention)
with projected length k. Each configuration runs in a fresh process so its peak RSS is its own; the
memory column is the peak RSS above the process's baseline after creating the inputs. Time is the
best of 3. With --device cuda times are taken between synchronisations and memory is the peak GPU memory
allocated above the inputs (torch.cuda.max_memory_allocated). The paper's V100 ratios at n = 512 and n = 65536 (k = 128), the two quoted in the issue, are printed beside.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MEASURE = r"""
import json, resource, time, torch
device = torch.device({device!r})
def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()
def baseline():
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def peak():
    sync()
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def report(run):
    base = baseline()
    times = []
    for _ in range(3):
        sync(); t = time.perf_counter(); run(); sync(); times.append(time.perf_counter() - t)
    print(json.dumps(dict(seconds=min(times), memory_mb=peak() - base)))
"""

CHILD = MEASURE + r"""
from spectra.nn.linformer import linear_attention
from spectra.seeds import jl_matrix
method, n, budget, tokens = {method!r}, {n}, {budget}, {tokens}
batch, heads, d = max(1, tokens // n), 12, 64
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(batch, heads, n, d, generator=g).to(device) for _ in range(3))
if method == "linformer":
    e = jl_matrix(budget, n, 1)[None].to(device)
    f = jl_matrix(budget, n, 2)[None].to(device)
    run = lambda: linear_attention(q, k, v, e, f)
elif method == "sdpa":
    run = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
else:
    run = lambda: torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5, dim=-1) @ v
with torch.inference_mode():
    report(run)
"""

ENCODER_CHILD = MEASURE + r"""
from transformers import RobertaConfig, RobertaModel
from spectra import capture
from spectra.nn import linformer, projections as proj
method, n, budget, tokens = {method!r}, {n}, {budget}, {tokens}
batch, layers = max(1, tokens // n), 4
config = RobertaConfig(vocab_size=1000, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                       intermediate_size=3072, max_position_embeddings=n + 2)
torch.manual_seed(0)
config._attn_implementation = "spectra" if method == "linformer" else method  # the model reads it at build time
model = RobertaModel(config, add_pooling_layer=False).eval().to(device)
ids = torch.randint(5, 1000, (batch, n)).to(device)
substitute = None
if method == "linformer":
    projections = proj.Projections(layers, 12, budget, n, "headwise", trainable=False).to(device)
    substitute = linformer.substitute(projections)
def run():
    with torch.inference_mode(), capture.capturing(substitute=substitute):
        model(input_ids=ids)
report(run)
"""

#: the two corners of the paper's Table 3 quoted in the project's issue (inference time / memory saved by
#: Linformer vs a standard Transformer on a V100), keyed (n, k); other cells are not reproduced here
PAPER = {(512, 128): (1.5, 1.7), (65536, 128): (20, 60)}


def measure(method: str, n: int, budget: int, tokens: int, encoder: bool = False, device: str = "cpu") -> dict:
    code = (ENCODER_CHILD if encoder else CHILD).format(method=method, n=n, budget=budget, tokens=tokens, device=device)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return {"seconds": float("nan"), "memory_mb": float("nan"), "error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--budgets", default="64,128,256")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--encoder", action="store_true",
                        help="a whole 4-layer encoder (hidden 768, 12 heads) instead of one attention layer; "
                             "Linformer runs as the capture substitution with headwise JL projections")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    print(f"device {args.device}, {args.tokens} tokens per batch{', 4-layer encoder' if args.encoder else ''}")
    print("| n | batch | eager (s, MiB) | sdpa (s, MiB) | linformer k | linformer (s, MiB) "
          "| time: eager/lin, sdpa/lin | memory: eager/lin, sdpa/lin | paper time, memory (V100) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.lengths.split(",")):
        eager, sdpa = (measure(method, n, 0, args.tokens, args.encoder, args.device) for method in ("eager", "sdpa"))
        for budget in (int(x) for x in args.budgets.split(",")):
            lin = measure("linformer", n, budget, args.tokens, args.encoder, args.device)
            paper = PAPER.get((n, budget))
            print(f"| {n} | {max(1, args.tokens // n)} | {eager['seconds']:.3f}, {eager['memory_mb']:.0f} "
                  f"| {sdpa['seconds']:.3f}, {sdpa['memory_mb']:.0f} | {budget} "
                  f"| {lin['seconds']:.3f}, {lin['memory_mb']:.0f} "
                  f"| {eager['seconds'] / lin['seconds']:.2f}×, {sdpa['seconds'] / lin['seconds']:.2f}× "
                  f"| {eager['memory_mb'] / max(lin['memory_mb'], 1):.1f}×, {sdpa['memory_mb'] / max(lin['memory_mb'], 1):.1f}× "
                  f"| {f'{paper[0]}×, {paper[1]}×' if paper else '—'} |", flush=True)


if __name__ == "__main__":
    main()
