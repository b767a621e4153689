"""End to end: `spectra analyze` on a randomly initialised RoBERTa-base-sized model at n = 512.

    python benchmarks/analyze_e2e.py [--samples 8,16,32] [--length 512] [--batch-size 4]
                                     [--device cpu|cuda] [--overlap auto|on|off] [--spectrum-device auto|cpu|same|cuda]

Each sample count runs in a fresh process (so peak resident memory is that run's own), which also
times, on the run's own first batch, the bare forward pass (the model as users run it, SDPA attention,
no capture) and the bare spectrum stage (the exact probe on that batch's own P, captured beforehand). Reported: sequences/s,
steady-state time per sequence (first finished batch to last, so model loading and tokenizer start-up
are left out) against (bare forward + bare spectrum), and peak RSS. On CUDA the bare spectrum is timed
on the GPU and on the CPU (the faster counts) and peak GPU memory is reported too; the run's own choice of
spectrum device and overlap is printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time, tempfile
from pathlib import Path
import torch, transformers
from transformers import RobertaConfig, RobertaForMaskedLM
sys.path.insert(0, {tests!r})
import tiny
import spectra, spectra.capture, spectra.data, spectra.models
from spectra.probes.spectrum import SpectrumProbe

samples, n, batch, device = {samples}, {length}, {batch}, {device!r}
overlap = {{"auto": None, "on": True, "off": False}}[{overlap!r}]
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
root = Path(tempfile.mkdtemp())
tokenizer = tiny._tokenizer("roberta")
config = RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=n + 2, pad_token_id=tokenizer.pad_token_id)
torch.manual_seed(0)
RobertaForMaskedLM(config).save_pretrained(root / "model")
tokenizer.save_pretrained(root / "model")
tiny.write_text(root / "corpus.txt", count=4000)
marks = []
start = time.perf_counter()
run = spectra.analyze(str(root / "model"), str(root / "corpus.txt"), length=n, samples=samples, batch_size=batch,
                      device=device, overlap=overlap, spectrum_device={place!r}, out=root / "run", notify=lambda line: None,
                      progress=lambda done, total: marks.append((time.perf_counter(), done)))
total = time.perf_counter() - start
(t0, d0), (t1, d1) = marks[1], marks[-1]  # from the first finished batch to the last: steady state
steady = (t1 - t0) / (d1 - d0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
gpu_peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0
chosen = json.loads((root / "run" / "run.json").read_text())
# bare forward (SDPA, as users run it) and bare spectrum on the run's own first batch: the SVD's cost
# depends on P's structure, so it must be timed on the same sequences' P
loaded = spectra.models.load(str(root / "model"), device=device)
corpus = spectra.data.open_corpus(str(root / "corpus.txt"))
first = next(spectra.data.batches(loaded.tokenizer, corpus, n, "pack", batch, batch))
ids, mask = first.input_ids.to(device), first.attention_mask.to(device)
model = transformers.AutoModel.from_pretrained(root / "model").eval().to(device)
with torch.inference_mode():
    model(input_ids=ids, attention_mask=mask)
    sync()
    t = time.perf_counter()
    model(input_ids=ids, attention_mask=mask)
    sync()
    forward = (time.perf_counter() - t) / batch
def keep(captured):
    kept.append((captured.layer, captured.valid, captured.p.clone()))
kept = []
with torch.inference_mode(), spectra.capture.capturing(keep):
    loaded.model(input_ids=ids, attention_mask=mask)
spectrum = {{}}
for where in {{device, "cpu"}}:
    probe = SpectrumProbe(config.num_hidden_layers, 12, n, n // 4)
    sync()
    t = time.perf_counter()
    for layer, valid, p in kept:
        probe.add(layer, p.to(where), valid.to(where), list(range(batch)))
    sync()
    spectrum[where] = (time.perf_counter() - t) / batch
print(json.dumps(dict(samples=samples, seconds=total, steady=steady, peak_mb=peak, gpu_peak_mb=gpu_peak,
                      forward=forward, spectrum=spectrum, chosen=dict(device=chosen["spectrum_device"],
                      overlap=chosen["overlap"], seconds=chosen.get("spectrum_seconds")))))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", default="8,16,32")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--overlap", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--spectrum-device", default="auto", choices=["auto", "cpu", "same", "cuda"])
    args = parser.parse_args()
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    print(f"device {args.device}, overlap {args.overlap}, spectrum device {args.spectrum_device}")
    print("| samples | wall incl. load (s) | steady s/seq | bare forward + bare spectrum (s/seq) | ratio | peak RSS (MiB) "
          "| peak GPU (MiB) | spectra ran on, overlap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for samples in (int(x) for x in args.samples.split(",")):
        code = CHILD.format(tests=tests, samples=samples, length=args.length, batch=args.batch_size,
                            device=args.device, overlap=args.overlap, place=args.spectrum_device)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(done.stderr[-2000:])
        r = json.loads(done.stdout.strip().splitlines()[-1])
        spectrum = min(r["spectrum"].values())
        bare = r["forward"] + spectrum
        timed = ", ".join(f"{where} {seconds:.3f} s" for where, seconds in (r["chosen"]["seconds"] or {}).items())
        print(f"| {samples} | {r['seconds']:.1f} | {r['steady']:.3f} | "
              f"{r['forward']:.3f} + {spectrum:.3f} = {bare:.3f} | {r['steady'] / bare:.2f} | {r['peak_mb']:.0f} "
              f"| {r['gpu_peak_mb']:.0f} | {r['chosen']['device']}{' (' + timed + ')' if timed else ''}, "
              f"{'on' if r['chosen']['overlap'] else 'off'} |", flush=True)


if __name__ == "__main__":
    main()
