"""How well KVzap's surrogate, fitted by `spectra artifacts kvzap`, predicts KVzip's scores on held-out text.

Fits the linear and the MLP surrogate on blocks of the --fit files (the same data, KVzip's reconstruction scores and
the layers' hidden states, `kv.surrogate.collect`, gathered once for both), writes each as kvpress's KVzapModel
directory under --out (linear/, mlp/), then prints per layer the mean over key/value heads of R² (log-scores) and
Spearman (scores) on blocks of the --held-out files, which the fit never saw (and their means without the sinks,
whose KVzip scores are raised above every other).

    python benchmarks/kvzap_fit.py $GGUF --fit /usr/share/common-licenses/GPL-3,... \\
        --held-out /usr/share/common-licenses/GPL-2 --out /tmp/kvzap --length 512 --samples 12 --threads 1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spectra import models, runtime
from spectra.kv import artifacts, reconstruction, surrogate
from spectra.kv.artifactfit import ArtifactRequest, text_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--fit", required=True, help="text files to fit on, comma-separated")
    parser.add_argument("--held-out", required=True, help="text files to evaluate on, comma-separated")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--held-out-samples", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with runtime.threads(args.threads):
        loaded = models.load(args.model, device="cpu")
        repetition = reconstruction.Repetition.of(loaded.tokenizer)
        data = {}
        for what, files, samples in (("fit", args.fit, args.samples), ("held-out", args.held_out,
                                                                       args.held_out_samples)):
            request = ArtifactRequest("kvzap", args.model, tuple(Path(f) for f in files.split(",")), args.out,
                                      args.length, samples, args.threads, None, True, "mlp")
            blocks = text_blocks(loaded.tokenizer, request)
            started = time.perf_counter()
            data[what] = surrogate.collect(loaded.model, loaded.layers, blocks, repetition)
            print(f"{what}: {len(blocks)} blocks of {args.length} tokens, {data[what][0].shape[1]} rows, "
                  f"prefill + KVzip {time.perf_counter() - started:.1f} s")
        for kind in surrogate.KINDS:
            started = time.perf_counter()
            tensors, config = surrogate.fit(*data["fit"], kind)
            written = artifacts.write(args.out / kind, tensors, config)
            states, scores = data["held-out"]
            table = surrogate.quality(tensors, states, scores)
            print(f"\n{kind}: fitted in {time.perf_counter() - started:.1f} s, written to {written}")
            print(table.groupby("layer")[["r2", "spearman"]].mean().round(3).to_string())
            print(f"mean over layers and heads: R² {table['r2'].mean():.3f}, Spearman {table['spearman'].mean():.3f}")
            measured = (scores <= 1).all(dim=2).all(dim=0)  # the sinks' KVzip scores are raised above 1
            plain = surrogate.quality(tensors, states[:, measured], scores[:, measured])
            print(f"without the sinks: R² {plain['r2'].mean():.3f}, Spearman {plain['spearman'].mean():.3f}")
            fitted = surrogate.quality(tensors, *data["fit"])
            print(f"(on the fit's own blocks: R² {fitted['r2'].mean():.3f}, Spearman {fitted['spearman'].mean():.3f})")


if __name__ == "__main__":
    main()
