"""Where `spectra cache`'s prefill_decoding(<scorer>,<decodable>) first keeps other tokens than kvpress 0.5.5's
PrefillDecodingPress, on benchmarks/kvpress_check.py's NLL protocol (the same model, token blocks and settings).

    python benchmarks/kvpress_kept.py [KVPRESS_PYTHON] --press 'prefill_decoding(snapkv,tova)' --ratio 0.25
                                      [--context 256] [--continuation 32] [--samples 2] [--compression-interval 1]
                                      [--seed 0] [--threads 1] [--kvpress-order]

Both sides record, per sequence and layer, the rows kept at the prefill's eviction (and the prefill scorer's scores)
and at every decoding compression; each side's rows are followed back to the context positions (or continuation
tokens) every key/value head's cache holds. Printed per sequence: each layer's first compression at which a head
keeps other tokens than kvpress's (positions from the context length on: continuation tokens), and each head whose
prefill rows come in another order, with both sides' float32 scores of the reordered positions and their gaps in ulp
— the order matters to a decoding scorer that reads row indices (TOVA pools each row index over the key/value heads;
StreamingLLM protects the first rows). With --kvpress-order, spectra's prefill rows are put in kvpress's order (the
same rows per head, checked) before it decodes: whether the order alone accounts for a gap. Then the NLL per
sequence of both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from itertools import pairwise
from pathlib import Path

# this file's folder is on the path (a script's own folder)
from kvpress_check import GGUF, LICENCES, smollm2_folder
from kvpress_tasks import KVPRESS_NAMES, kvpress_model, split_arguments

#: spectra's decodable scorers (kvpress scores them at a decoding step)
DECODABLE = ("streaming", "knorm", "tova")


def worker(job_path: str, result_path: str) -> None:
    """kvpress's PrefillDecodingPress on the job's token blocks, every ScorerPress compression recorded."""
    import kvpress
    import torch
    from kvpress.presses.scorer_press import ScorerPress
    from kvpress.utils import compute_n_kept
    from transformers import DynamicCache

    job = json.loads(Path(job_path).read_text())
    model = kvpress_model(job)
    context, ratio = job["context"], job["ratio"]
    names = split_arguments(job["press"][len("prefill_decoding("):-1])
    first, second = names[0], names[-1]
    log: list[dict] = []
    where = {"kind": "prefill", "index": 0}
    compress = ScorerPress.compress

    def recorded(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio:
            scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
            kept = scores.topk(compute_n_kept(keys.shape[2], self.compression_ratio), dim=-1).indices
            log.append({**where, "layer": module.layer_idx, "kept": kept[0].tolist(),
                        "scores": scores[0].tolist() if where["kind"] == "prefill" else None})
        return compress(self, module, hidden_states, keys, values, attentions, kwargs)

    ScorerPress.compress = recorded

    def press():
        return kvpress.PrefillDecodingPress(
            prefilling_press=getattr(kvpress, KVPRESS_NAMES[first])(compression_ratio=ratio),
            decoding_press=kvpress.DecodingPress(base_press=getattr(kvpress, KVPRESS_NAMES[second])(),
                                                 compression_interval=job["interval"],
                                                 target_size=max(1, int(context * (1 - ratio)))))

    nll = []
    for index, ids in enumerate(job["sequences"]):
        ids = torch.tensor(ids)
        ctx, cont = ids[:context], ids[context:]
        cache = DynamicCache()
        with torch.inference_mode():
            where.update(kind="prefill", index=index)
            with press()(model):
                logits = [model(input_ids=ctx[None], past_key_values=cache, logits_to_keep=1).logits[0]]
            where["kind"] = "step"
            with press()(model):
                logits += [model(input_ids=cont[None, j:j + 1], past_key_values=cache,
                                 position_ids=torch.tensor([[context + j]])).logits[0] for j in range(len(cont) - 1)]
        logp = torch.log_softmax(torch.cat(logits).double(), -1)
        nll.append(-logp.gather(-1, cont[:, None])[:, 0].mean().item())
    Path(result_path).write_text(json.dumps({"log": log, "nll": nll}))


def spectra_side(args: argparse.Namespace, corpus: Path, out: Path, order: dict | None) -> tuple[list[dict], list]:
    """spectra's run of the press at the ratio, its prefill evictions and decoding compressions recorded (and its
    prefill rows put in `order`, kvpress's, when given); returns the records and the NLL per sequence."""
    import torch

    import spectra
    from spectra.kv.presses.decoding import DecodingPress
    from spectra.kv.presses.prefilldecoding import PrefillDecodingPress

    log: list[dict] = []
    compress, keep = PrefillDecodingPress.compress, DecodingPress.keep

    def compress_recorded(self, prefill, ratio):
        compressed = compress(self, prefill, ratio)
        theirs = None if order is None else order.get((prefill.index, prefill.layer))
        if theirs is not None:
            theirs = torch.tensor(theirs, dtype=compressed.kept.dtype, device=compressed.kept.device)
            if not torch.equal(theirs.sort(-1).values, compressed.kept.sort(-1).values):
                sys.exit(f"--kvpress-order: layer {prefill.layer} of sequence {prefill.index} keeps other rows than "
                         "kvpress's (not only another order)")
            compressed.kept.copy_(theirs)
        log.append({"kind": "prefill", "index": prefill.index, "layer": prefill.layer,
                    "kept": compressed.kept.tolist(), "scores": self.evicting.score(prefill, ratio).tolist()})
        return compressed

    def keep_recorded(self, layer, q, key, value, scaling, target, seed=0, index=0):
        kept = keep(self, layer, q, key, value, scaling, target, seed, index)
        log.append({"kind": "step", "index": index, "layer": layer, "kept": None if kept is None else kept.tolist()})
        return kept

    PrefillDecodingPress.compress, DecodingPress.keep = compress_recorded, keep_recorded
    try:
        run = spectra.cache(smollm2_folder(), str(corpus), presses=[args.press], ratios=[args.ratio], out=out,
                            gguf_file=GGUF, context=args.context, continuation=args.continuation,
                            samples=args.samples, seed=args.seed, mode="pack", progress=None,
                            notify=lambda line: None, compression_interval=args.compression_interval)
    finally:
        PrefillDecodingPress.compress, DecodingPress.keep = compress, keep
    mine = run.sequences[run.sequences["press"] == args.press].sort_values("sequence")["nll"].tolist()
    return log, mine


def followed(log: list[dict], index: int, context: int,
             interval: int) -> dict[int, list[tuple[str, list[list[int]]]]]:
    """Per layer, after each compression of sequence `index`: the positions (context, then continuation) every
    key/value head's cache holds, in its rows' order (`interval` tokens appended between two compressions)."""
    out: dict[int, list[tuple[str, list[list[int]]]]] = {}
    held: dict[int, list[list[int]]] = {}
    steps: dict[int, int] = {}
    for record in log:
        if record["index"] != index:
            continue
        layer, kept = record["layer"], record["kept"]
        if record["kind"] == "prefill":
            rows, steps[layer] = [list(range(context)) for _ in kept], 0
        else:
            fed = range(context + steps[layer] * interval, context + (steps[layer] + 1) * interval)
            rows = [head + list(fed) for head in held[layer]]
            steps[layer] += 1
        if kept is not None:
            held[layer] = [[rows[head][row] for row in chosen] for head, chosen in enumerate(kept)]
            out.setdefault(layer, []).append((record["kind"], held[layer]))
        else:
            held[layer] = rows
    return out


def ulps(a: float, b: float) -> int:
    """How many float32 values lie between a and b (same sign)."""
    import numpy as np

    return abs(int(np.float32(a).view(np.int32)) - int(np.float32(b).view(np.int32)))


def flips(layer: int, ours: list[list[int]], theirs: list[list[int]], scores: tuple[list, list]) -> None:
    """Print each head whose prefill rows (context positions) come in another order than kvpress's, with both
    sides' scores (float32) of the positions in the reordered ranks and their gaps in ulp."""
    for head, (x, y) in enumerate(zip(ours, theirs)):
        swapped = [rank for rank, (p, q) in enumerate(zip(x, y)) if p != q]
        if not swapped:
            continue
        first, last = swapped[0], swapped[-1] + 1
        print(f"  layer {layer} head {head}: prefill ranks {first}–{last - 1} in another order (spectra "
              f"{x[first:last]}, kvpress {y[first:last]})")
        mine, kv = scores[0][head], scores[1][head]
        positions = sorted(set(x[first:last]))
        for p in positions:
            print(f"    position {p}: spectra {mine[p]:.10g}, kvpress {kv[p]:.10g} ({ulps(mine[p], kv[p])} ulp apart)")
        print(f"    between them: spectra {[ulps(mine[p], mine[q]) for p, q in pairwise(positions)]} ulp, kvpress "
              f"{[ulps(kv[p], kv[q]) for p, q in pairwise(positions)]} ulp")


def report(mine: list[dict], theirs: list[dict], sequences: int, context: int, interval: int) -> None:
    """Print, per sequence, each prefill order flip and each layer's first compression keeping other tokens."""
    scores = {(side, r["index"], r["layer"]): r["scores"] for side, log in (("spectra", mine), ("kvpress", theirs))
              for r in log if r["kind"] == "prefill"}
    for index in range(sequences):
        ours, kv = followed(mine, index, context, interval), followed(theirs, index, context, interval)
        print(f"sequence {index}:")
        for layer in sorted(ours):
            for step, ((kind, a), (_, b)) in enumerate(zip(ours[layer], kv[layer])):
                if kind == "prefill" and a != b:
                    flips(layer, a, b, (scores[("spectra", index, layer)], scores[("kvpress", index, layer)]))
                if [set(head) for head in a] != [set(head) for head in b]:
                    head = next(h for h, (x, y) in enumerate(zip(a, b)) if set(x) != set(y))
                    when = "the prefill" if kind == "prefill" else f"decoding compression {step}"
                    print(f"  layer {layer}, {when}, head {head}: spectra keeps "
                          f"{sorted(set(a[head]) - set(b[head]))}, kvpress {sorted(set(b[head]) - set(a[head]))}")
                    break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", nargs="?", default="/work/kvpress-venv/bin/python",
                        help="Python of a venv with kvpress 0.5.5 (default /work/kvpress-venv/bin/python).")
    parser.add_argument("--press", default="prefill_decoding(snapkv,tova)",
                        help="prefill_decoding(<scorer>,<decodable>), both at kvpress's defaults.")
    parser.add_argument("--ratio", type=float, default=0.25)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--continuation", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--compression-interval", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on both sides.")
    parser.add_argument("--kvpress-order", action="store_true",
                        help="Put spectra's prefill rows in kvpress's order (the same rows) before it decodes.")
    args = parser.parse_args()
    inner = split_arguments(args.press[len("prefill_decoding("):-1]) if args.press.endswith(")") else []
    if not (args.press.startswith("prefill_decoding(") and len(inner) == 2 and inner[0] in KVPRESS_NAMES
            and inner[1] in DECODABLE):
        print(f"--press takes prefill_decoding(<scorer>,<decodable>), the decodable one of {', '.join(DECODABLE)}, "
              f"e.g. prefill_decoding(snapkv,tova); got {args.press}", file=sys.stderr)
        sys.exit(2)

    import torch

    from spectra import checkpoints, data, models

    torch.set_num_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="kvpress_kept_"))
    corpus = scratch / "licenses.txt"
    corpus.write_text("".join(Path("/usr/share/common-licenses", name).read_text() for name in LICENCES))
    folder = smollm2_folder()
    with models.reusing():  # the model loaded once, for the token blocks and spectra's run
        loaded = models.load(checkpoints.inspect(folder, GGUF), device="auto", lm_head=True)
        blocks = data.sequences(loaded.tokenizer, data.open_corpus(str(corpus), seed=args.seed),
                                args.context + args.continuation, "pack")
        sequences = [[int(token) for token in ids] for _, ids in zip(range(args.samples), blocks)]
        job = {"folder": folder, "context": args.context, "sequences": sequences, "press": args.press,
               "ratio": args.ratio, "interval": args.compression_interval, "threads": args.threads}
        (scratch / "job.json").write_text(json.dumps(job))
        subprocess.run([args.python, __file__, "--worker", str(scratch / "job.json"), str(scratch / "kvpress.json")],
                       check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
        theirs = json.loads((scratch / "kvpress.json").read_text())
        order = ({(r["index"], r["layer"]): r["kept"] for r in theirs["log"] if r["kind"] == "prefill"}
                 if args.kvpress_order else None)
        mine, nll = spectra_side(args, corpus, scratch / "spectra", order)
    print(f"{args.press} at {args.ratio:g}, context {args.context}, continuation {args.continuation}, interval "
          f"{args.compression_interval}" + ("\nspectra's prefill rows put in kvpress's order" if order else ""))
    report(mine, theirs["log"], len(sequences), args.context, args.compression_interval)
    for index, (ours, kv) in enumerate(zip(nll, theirs["nll"])):
        print(f"sequence {index}: NLL spectra {ours:.7f}, kvpress {kv:.7f}, |Δ| {abs(ours - kv):.1e}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
