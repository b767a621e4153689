"""The task protocol on a Llama-3.1-8B-shaped decoder on one GPU: peak GPU memory and seconds per example.

    python benchmarks/gpu/decoder.py [--model .gpu/llama8b] [--data .gpu/tasks.jsonl] [--presses 4x4|all]
                                     [--ratios 0.25,0.5,0.75,0.875] [--decode-memory 24] [--dtype bfloat16]

`spectra cache` as a user runs it (`--device cuda --dtype bfloat16`, one task record), except that the weights are
drawn at random on the GPU instead of read from disk: prepare.py's folder holds the 8B shape's config and a
tokenizer, and this script makes transformers' `from_pretrained` build the model from that config directly on the
GPU (the shapes are what cost, not the values; 16 GB of random weights need not be written and read back). With
random weights the model never says its end-of-answer token, so every cell decodes its full answer budget: the
slowest case. `--presses 4x4` is the sweep of benchmarks/tasks_bench.py (streaming, snapkv, knorm, tova × four
ratios) with the full cache; `all` is every press spectra has at its defaults (the default `--presses`). Printed:
the run's wall time, its stages from run.json (forward = the prefill with the capture, then the presses and the
decoding), seconds per example, the peak GPU memory (torch.cuda.max_memory_allocated) and the cells run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import transformers

import spectra

SWEEP_PRESSES = "streaming,snapkv,knorm,tova"


def draw_weights_on(device: str) -> None:
    """From here on, `AutoModelForCausalLM.from_pretrained(folder, …)` builds the folder's config with random
    weights on `device` (what spectra.models.load then moves to `device` is already there), and a model folder
    needs no weights file to pass spectra's checks."""
    from spectra import checkpoints

    from_config = transformers.AutoModelForCausalLM.from_config
    inspect = checkpoints.inspect
    checkpoints.inspect = lambda source, gguf_file=None, weights=True: inspect(source, gguf_file, weights=False)

    def random(where, *, attn_implementation=None, dtype=None, **options):
        config = transformers.AutoConfig.from_pretrained(where)
        torch.manual_seed(0)
        with torch.device(device):
            return from_config(config, attn_implementation=attn_implementation, dtype=dtype)

    transformers.AutoModelForCausalLM.from_pretrained = random


@contextlib.contextmanager
def profiled(wanted: bool, device: str):
    """torch.profiler over the run when `wanted` (CPU and, on a GPU, CUDA activity), else nothing."""
    if not wanted:
        yield None
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        yield profiler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=".gpu/llama8b")
    parser.add_argument("--data", default=".gpu/tasks.jsonl")
    parser.add_argument("--presses", default="4x4")
    parser.add_argument("--ratios", default="0.25,0.5,0.75,0.875")
    parser.add_argument("--decode-memory", type=float, default=24.0)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=1, help="examples whose cells decode together")
    parser.add_argument("--samples", type=int, default=None, help="records of the task file (default: all)")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's costliest operators")
    args = parser.parse_args()
    draw_weights_on(args.device)
    chosen = {"4x4": {"presses": SWEEP_PRESSES}, "all": {}}.get(args.presses, {"presses": args.presses})
    out = Path(tempfile.mkdtemp()) / "run"
    start = time.perf_counter()
    with profiled(args.profile, args.device) as profiler:
        run = spectra.cache(args.model, args.data, out=out, device=args.device, dtype=args.dtype, **chosen,
                            ratios=args.ratios, decode_memory=args.decode_memory, batch_size=args.batch_size,
                            samples=args.samples, progress=None, notify=print)
    wall = time.perf_counter() - start
    if profiler is not None:
        for sort in ("self_cuda_time_total", "self_cpu_time_total"):
            print(profiler.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=60))
    meta = json.loads((out / "run.json").read_text())
    examples = run.examples
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    print(f"presses {args.presses} ({examples['press'].nunique()} presses incl. full), ratios {args.ratios}: "
          f"{len(examples)} cells over {examples['example'].nunique()} example(s) of {int(examples['length'].max())} "
          f"tokens; {args.dtype} on {torch.cuda.get_device_name() if args.device == 'cuda' else args.device}")
    print(f"wall {wall:.1f} s (model built and run; the run itself {meta['wall_seconds']:.1f} s); "
          f"peak GPU memory {peak:.2f} GiB; per example {meta['wall_seconds'] / examples['example'].nunique():.1f} s")
    print("run.json timings: " + json.dumps(meta.get("timings")))
    seconds = pd.DataFrame(meta["press_seconds"]).groupby("press")[["compress", "decode"]].sum()
    print("compress and decode seconds per press (all ratios):")
    print(seconds.sort_values("compress", ascending=False).round(3).to_string())
    print(examples.groupby("press")[["kept", "bytes_share"]].mean().round(3).to_string())

if __name__ == "__main__":
    main()
