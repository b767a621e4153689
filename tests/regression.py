"""A fixed set of tiny runs through the public API, their outputs as files, and how far rounding may move them.

`make(root)` runs every analysis kind: on a tiny RoBERTa built from a config, analyze in pack and truncate mode,
approx with every method family and end to end, theorems on a model and on synthetic q, k, v, and scaling (its
analyze and approx runs per length included); on a tiny Llama built from a config (RoPE, grouped-query attention,
a chat template), heads, cache with the NLL protocol — every registered press bare, the axis map (`--bytes-kept`)
joined with the heads case's diagnosis, and every press taking an argument fed by the earlier cases' runs
(adakv(·), decoding(·) while the continuation is fed, duo and headbudget from the heads case, mixed from the axis
map) — and the task study on a tiny task file in both modes (query-agnostic and `--query-aware`), and on its
records asked two questions each (the many-question protocol) by the presses reading what a plain prefill does not
compute: the whole-model passes (kvzip, kvgrad, kvcompose), the received attention and the pre-RoPE queries.
`outputs(run_dir)` reads back what a run wrote: every file of the run directory and of its sub-runs byte for byte,
except that run.json loses what legitimately varies (timings, versions, sources, the device) and the temporary root
in every text file (run.json, and press labels such as duo(<root>/runs/heads)) reads `<root>`.

tests/golden/<case>/ holds those files and `tolerances.json`, how far each column (or array) may move on
another machine. tests/test_regression.py compares the suite's outputs with them, always through those
tolerances (never bitwise: another CPU's kernels round differently). The tolerances are derived here from
the computation itself, by `tolerances.derive`: every case is run again, 16 times, on inputs perturbed the
way another machine's rounding perturbs them — each weight of the tiny model (and each synthetic q, k, v)
multiplied by 1 + u·2⁻²³, u ~ U(−1, 1) seeded — and the largest move of each column sets its tolerance
(tests/tolerances.py has the rules, discrete columns included).

Usage (from the repository root):

    python tests/regression.py                  # regenerate tests/golden/ (outputs and tolerances.json)
    python tests/regression.py --cases A,B      # the same, writing only cases A and B (all are run)
    python tests/regression.py --snapshot DIR   # write this machine's outputs to DIR
    python tests/regression.py --compare DIR    # bitwise against a snapshot written on this machine

Regenerate the baseline only for a change that is meant to change numbers, and say why in the commit; it
prints where the previous baseline lies beyond the new tolerances, which should be only where numbers
were meant to change. `--snapshot` before a
refactor and `--compare` after it check the same-machine promise that a refactor leaves every output
bitwise unchanged; that is a developer's check, not part of the test suite (a snapshot from one machine
means nothing on another).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import tolerances

GOLDEN = Path(__file__).parent / "golden"
QUIET: dict[str, Any] = dict(progress=None, notify=lambda line: None)
#: run.json keys that vary between machines and runs without changing a result (`weights` and `artifacts`: the sha256
#: of files the perturbed runs rewrite)
VOLATILE = {"wall_seconds", "versions", "source", "device", "spectrum_seconds", "timings", "press_seconds", "weights",
            "artifacts"}
#: perturbed runs behind the tolerances, and their relative size: one float32 rounding (2⁻²³)
PERTURBATIONS = 16
AMPLITUDE = 2.0**-23

Outputs = dict[str, dict[str, bytes]]


@dataclass(frozen=True)
class Inputs:
    """What the cases read: the tiny encoder, the tiny decoder (with a chat template), the corpus and the task files
(`many`: the same records, each asking a second question)."""

    model: str
    corpus: str
    decoder: str
    tasks: str
    many: str = ""


#: the cache cases' sequences: a context past KIVI's 128-token residual (so kivi quantizes) and SnapKV's 64-token
#: window at every ratio, and a short continuation
CACHE: dict[str, Any] = dict(context=160, continuation=8, samples=2, **QUIET)
#: the task cases' presses: a scorer of each kind of score, channels, rank, bits, a wrapper, one acting while decoding
TASK_PRESSES = "streaming,knorm,snapkv,observed,think,lowrank,kivi4,adakv(snapkv),decoding(knorm)"
#: the many-question case's presses: each reads something of the prefill beyond the cache (the whole-model passes'
#: scores, the received attention, the pre-RoPE queries)
PASS_PRESSES = "kvzip,kvgrad,kvcompose,observed,expected_attention"


def cases(given: Inputs) -> dict[str, Callable[[Path], object]]:
    """Each case: a name and a function running it into a given directory (root/runs/<case>). They run in this order:
    a case may read an earlier case's run beside its own (`out.parent / name`), as the presses with an argument do."""
    import spectra
    from spectra.registry import PRESSES

    model, corpus, decoder = given.model, given.corpus, given.decoder
    every = ["svd", "jl", "linformer", "pool-mean", "pool-max", "performer", "nystrom", "nystrom-iter6", "skyformer",
             "probsparse"]

    def arguments(out: Path) -> str:
        heads, axes = out.parent / "heads", out.parent / "cache-axes"
        return ",".join(["adakv(knorm)", "adakv(snapkv)", "decoding(knorm)", "decoding(streaming)", "decoding(tova)",
                         f"duo({heads})", f"headbudget({heads})", f"headbudget({heads}@rank)", f"mixed({axes})"])

    return {
        "analyze-pack": lambda out: spectra.analyze(model, corpus, length=32, samples=6, batch_size=4, out=out,
                                                    **QUIET),
        "analyze-truncate": lambda out: spectra.analyze(model, corpus, length=32, samples=7, batch_size=3,
                                                        mode="truncate", at=5, seed=3, out=out, **QUIET),
        "approx-all": lambda out: spectra.approx(model, corpus, budget=[4, 12], methods=every, length=24, samples=6,
                                                 batch_size=4, end_to_end=True, fixed_projection=True, out=out,
                                                 **QUIET),
        "approx-draws": lambda out: spectra.approx(model, corpus, budget=[4, 12], methods=["jl", "linformer",
                                                   "performer"], length=24, samples=5, batch_size=2, seed=1, out=out,
                                                   **QUIET),
        "approx-orthogonal-truncate": lambda out: spectra.approx(model, corpus, budget=[3, 8],
                                                                 methods=["jl", "linformer(kv)", "pool-max"],
                                                                 projection="orthogonal", mode="truncate", length=24,
                                                                 samples=5, batch_size=2, end_to_end=True, layers="1",
                                                                 target=0.3, seed=2, fixed_projection=True,
                                                                 out=out, **QUIET),
        "theorems-model": lambda out: spectra.theorems(model, corpus, budget=[4, 8], eps=[0.3, 0.5], length=24,
                                                       samples=4, batch_size=2, fixed_projection=True, out=out,
                                                       **QUIET),
        "theorems-draws": lambda out: spectra.theorems(model, corpus, budget=[4, 8], eps=[0.3, 0.5], length=24,
                                                       samples=5, batch_size=2, draws=2, out=out, **QUIET),
        "theorems-synthetic": lambda out: spectra.theorems(None, synthetic=True, budget=[4, 16], eps=[0.2, 0.5],
                                                           d=8, heads=2, length=32, samples=5, batch_size=2,
                                                           fixed_projection=True, out=out, progress=None),
        "scaling": lambda out: spectra.scaling(model, corpus, lengths=[16, 32, 48], samples=4, batch_size=2,
                                               bootstrap=20, approx_target=0.3, methods=["svd", "pool-mean"], out=out,
                                               **QUIET),
        "heads": lambda out: spectra.heads(decoder, corpus, length=48, samples=4, batch_size=2, window=8, recent=8,
                                           out=out, **QUIET),
        "cache-presses": lambda out: spectra.cache(decoder, corpus, presses=PRESSES.bare(), ratios=[0.25, 0.5],
                                                   out=out, **CACHE),
        "cache-axes": lambda out: spectra.cache(decoder, corpus, presses="streaming,knorm,loki,think,lowrank,kivi2,"
                                                "kivi4", ratios=[0.5, 0.75], fit_samples=1, bytes_kept=0.5,
                                                heads_run=out.parent / "heads", out=out, **CACHE),
        "cache-arguments": lambda out: spectra.cache(decoder, corpus, presses=arguments(out), ratios=0.5,
                                                     compression_interval=3, out=out, **CACHE),
        "tasks": lambda out: spectra.cache(decoder, given.tasks, presses=TASK_PRESSES, ratios=[0.5, 0.75],
                                           compression_interval=2, out=out, **QUIET),
        "tasks-query-aware": lambda out: spectra.cache(decoder, given.tasks, presses=TASK_PRESSES, ratios=[0.5, 0.75],
                                                       compression_interval=2, query_aware=True, out=out, **QUIET),
        "tasks-passes": lambda out: spectra.cache(decoder, given.many, presses=PASS_PRESSES, ratios=[0.5, 0.75],
                                                  out=out, **QUIET),
    }


def _scrub(meta: Any, root: str) -> Any:
    """run.json without volatile keys, temporary paths replaced by a placeholder."""
    if isinstance(meta, dict):
        return {key: _scrub(value, root) for key, value in meta.items() if key not in VOLATILE}
    if isinstance(meta, list):
        return [_scrub(value, root) for value in meta]
    if isinstance(meta, str):
        return meta.replace(root, "<root>")
    return meta


def _files(folder: Path) -> list[Path]:
    """Every file under `folder` (a run's sub-runs included: scaling's n16/, approx-n16/, …), sorted by path."""
    return sorted((path for path in folder.rglob("*") if path.is_file()),
                  key=lambda path: path.relative_to(folder).as_posix())


def outputs(run_dir: Path, root: Path) -> dict[str, bytes]:
    """What a finished run wrote: every file's bytes by its path in the run ("n16/metrics.csv"), run.json scrubbed
    (see `_scrub`) and `root` written `<root>` in every text file (labels such as duo(<root>/runs/heads))."""
    found = {}
    for path in _files(run_dir):
        name = path.relative_to(run_dir).as_posix()
        if path.name == "run.json":
            meta = _scrub(json.loads(path.read_text()), str(root))
            found[name] = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
        elif path.suffix == ".npz":
            found[name] = path.read_bytes()
        else:
            found[name] = path.read_bytes().replace(str(root).encode(), b"<root>")
    return found


def inputs(root: Path) -> Inputs:
    """The tiny models, corpus and task file every case reads, written under `root`."""
    import task_files
    import tiny

    model = tiny.save_model(root / "models" / "tiny-roberta", "roberta")
    decoder = task_files.save_chat_decoder(root / "models" / "tiny-llama")
    (root / "data").mkdir(parents=True, exist_ok=True)
    corpus = tiny.write_text(root / "data" / "corpus.txt", count=200)
    tasks = task_files.write(root / "data" / "tasks.jsonl", task_records())
    many = task_files.write(root / "data" / "many.jsonl", task_files.many_questions(task_records()))
    return Inputs(str(model), str(corpus), str(decoder), str(tasks), str(many))


#: the task file's answers: words the tiny decoder's greedy answers hold often enough that scores are neither all
#: 0 nor all 1 (a random decoder copies nothing), two per example so that string_match_all (the share found) and
#: string_match_part (any found) differ; the haystack never holds them, so the needle is where it was put
ANSWERS = (["complain", "most"], ["while", "most"], ["most", "complain"], ["complain", "while"])


def task_records() -> list[dict]:
    """Four records in kvpress's format: a needle sentence holding the answers at depths 0, 1/3, 2/3 and 1 of a
    70-word haystack of tiny.WORDS; passkey (RULER's string_match_all: the share of the answers found) and qa_1
    (string_match_part: 1 if any is found), two examples each."""
    import random

    import tiny

    rng = random.Random(0)
    hay = [word for word in tiny.WORDS if word not in {answer for answers in ANSWERS for answer in answers}]
    found = []
    for i, answers in enumerate(ANSWERS):
        words = [rng.choice(hay) for _ in range(70)]
        depth = i / (len(ANSWERS) - 1)
        words.insert(int(round(len(words) * depth)), f"the key is {' '.join(answers)} rank")
        found.append({"context": " ".join(words), "question": "what is the key? ", "answer_prefix": "the key is",
                      "answers": answers, "max_new_tokens": 5, "task": "passkey" if i % 2 == 0 else "qa_1",
                      "length": 160, "depth": depth})
    return found


def _factor(shape: tuple[int, ...], seed: int, amplitude: float):
    """1 + u·amplitude, u ~ U(−1, 1) from numpy's generator seeded by `seed` (float64; callers round it)."""
    import numpy as np

    return 1 + np.random.default_rng(seed).uniform(-1.0, 1.0, shape) * amplitude


def perturb_model(model: str, seed: int, amplitude: float) -> None:
    """Multiply every floating-point weight of the saved model by 1 + u·amplitude (u ~ U(−1, 1), seeded by
    `seed` and the weight's position in the file), in place: the rounding another machine's kernels add."""
    import torch
    from safetensors.torch import load_file, save_file

    path = Path(model) / "model.safetensors"
    weights = load_file(path)
    for number, (name, weight) in enumerate(sorted(weights.items())):
        if weight.is_floating_point():
            factor = torch.from_numpy(_factor(tuple(weight.shape), seed * 1000 + number, amplitude))
            weights[name] = (weight.double() * factor).to(weight.dtype)
    save_file(weights, path, metadata={"format": "pt"})


@contextlib.contextmanager
def perturbed_synthetic(seed: int, amplitude: float) -> Iterator[None]:
    """Synthetic q, k, v (`spectra.sources.gaussian_qkv`) multiplied by 1 + u·amplitude inside the block."""
    import torch

    from spectra import sources

    draw = sources.gaussian_qkv

    def perturbed(*args: Any, **kwargs: Any):
        drawn = draw(*args, **kwargs)
        salt = kwargs.get("seed", 0) % 1_000_003
        return tuple((t.double() * torch.from_numpy(_factor(tuple(t.shape), seed * 1_000_003 + salt + i, amplitude))
                      ).to(t.dtype) for i, t in enumerate(drawn))

    sources.gaussian_qkv = perturbed
    try:
        yield
    finally:
        sources.gaussian_qkv = draw


def make(root: Path, perturbation: int | None = None, amplitude: float = AMPLITUDE) -> Outputs:
    """Run every case under `root`; returns {case: {file: bytes}}. With `perturbation` (a seed), on the tiny
    model's weights and the synthetic q, k, v multiplied by 1 + u·amplitude (see `perturb_model`)."""
    import torch

    torch.set_num_threads(1)  # the baseline must not depend on how many cores split the batched SVDs
    given = inputs(root)
    context = contextlib.nullcontext()
    if perturbation is not None:
        for model in (given.model, given.decoder):
            perturb_model(model, perturbation, amplitude)
        context = perturbed_synthetic(perturbation, amplitude)
    results = {}
    with context:
        for name, run in cases(given).items():
            run(root / "runs" / name)
            results[name] = outputs(root / "runs" / name, root)
    return results


def fresh(perturbation: int | None = None) -> Outputs:
    """`make` in a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        return make(Path(tmp), perturbation)


def read(folder: Path) -> Outputs:
    """Outputs stored as folder/<case>/<file> (a golden baseline or a snapshot), without tolerances.json."""
    return {case.name: {path.relative_to(case).as_posix(): path.read_bytes() for path in _files(case)
                        if path.relative_to(case).as_posix() != tolerances.FILE}
            for case in sorted(folder.iterdir()) if case.is_dir()}


def write(folder: Path, results: Outputs) -> None:
    """Each case's files under folder/<case>/, replacing that case's folder (and only it)."""
    for case, files in results.items():
        shutil.rmtree(folder / case, ignore_errors=True)
        for name, content in files.items():
            (folder / case / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / case / name).write_bytes(content)


def regenerate(chosen: list[str] | None = None) -> None:
    """tests/golden/: this machine's outputs, and tolerances derived from PERTURBATIONS perturbed runs; prints
    where the previous baseline lies beyond the new tolerances (only the numbers meant to change should). With
    `chosen`, every case runs (later cases read earlier ones) but only the chosen cases' folders are written."""
    results = fresh()
    unknown = sorted(set(chosen or ()) - set(results))
    if unknown:
        raise SystemExit(f"no case {', '.join(unknown)}; the cases are {', '.join(results)}")
    perturbed = []
    for seed in range(PERTURBATIONS):
        print(f"perturbed run {seed + 1} of {PERTURBATIONS}", flush=True)
        perturbed.append(fresh(seed))
    derived = {case: tolerances.derive(files, [run[case] for run in perturbed], AMPLITUDE)
               for case, files in results.items()}
    old = read(GOLDEN) if GOLDEN.exists() else {}
    for case, files in results.items():
        if case in old:
            problems = tolerances.check(old[case], files, derived[case])
            print(f"{case}: the previous baseline is " + ("within the new tolerances" if not problems
                                                          else "beyond them in\n  " + "\n  ".join(problems)))
    for case in sorted(set(old) & set(results) - set(chosen or results)):  # left as committed: say how they compare
        same = old[case] == results[case]
        text = (GOLDEN / case / tolerances.FILE).read_text() == tolerances.dumps(derived[case]) + "\n"
        print(f"{case} (not written): outputs {'bitwise equal to' if same else 'differ from'} the committed ones, "
              f"derived tolerances {'equal to' if text else 'differ from'} the committed ones")
    results = {case: files for case, files in results.items() if chosen is None or case in chosen}
    write(GOLDEN, results)
    for case in results:
        (GOLDEN / case / tolerances.FILE).write_text(tolerances.dumps(derived[case]) + "\n")
    print(f"wrote {sum(len(files) for files in results.values())} files of {', '.join(results)} and their "
          f"tolerances under {GOLDEN}")


def compare(folder: Path) -> int:
    """Bitwise comparison with a snapshot written on this machine; returns the number of differing files."""
    want, got = read(folder), fresh()
    differing = [f"{case}/{name}" for case in sorted(set(want) | set(got))
                 for name in sorted(set(want.get(case, {})) | set(got.get(case, {})))
                 if want.get(case, {}).get(name) != got.get(case, {}).get(name)]
    print("\n".join(f"differs: {name}" for name in differing) or f"bitwise equal to {folder}")
    return len(differing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--snapshot", type=Path, metavar="DIR", help="write this machine's outputs to DIR")
    group.add_argument("--compare", type=Path, metavar="DIR", help="compare bitwise with a snapshot from this machine")
    group.add_argument("--cases", metavar="A,B", help="regenerate only these cases' golden folders")
    args = parser.parse_args(argv)
    if args.snapshot:
        shutil.rmtree(args.snapshot, ignore_errors=True)  # no case of an older snapshot stays behind
        write(args.snapshot, fresh())
        print(f"snapshot written to {args.snapshot}; after your change: python tests/regression.py --compare "
              f"{args.snapshot}")
        return 0
    if args.compare:
        return 1 if compare(args.compare) else 0
    regenerate(args.cases.split(",") if args.cases else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
