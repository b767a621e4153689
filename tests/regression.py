"""A fixed set of tiny runs through the public API, their outputs as files, and how far rounding may move them.

`make(root)` runs every analysis (analyze in pack and truncate mode, approx with every method family and
end to end, theorems on a model and on synthetic q, k, v) on a tiny RoBERTa built from a config, and
`outputs(run_dir)` reads back what a run wrote: every table and array file byte for byte, and run.json
without what legitimately varies (timings, versions, paths, the device).

tests/golden/<case>/ holds those files and `tolerances.json`, how far each column (or array) may move on
another machine. tests/test_regression.py compares the suite's outputs with them, always through those
tolerances (never bitwise: another CPU's kernels round differently). The tolerances are derived here from
the computation itself, by `tolerances.derive`: every case is run again, 16 times, on inputs perturbed the
way another machine's rounding perturbs them — each weight of the tiny model (and each synthetic q, k, v)
multiplied by 1 + u·2⁻²³, u ~ U(−1, 1) seeded — and the largest move of each column sets its tolerance
(tests/tolerances.py has the rules, discrete columns included).

Usage (from the repository root):

    python tests/regression.py                  # regenerate tests/golden/ (outputs and tolerances.json)
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import tolerances

GOLDEN = Path(__file__).parent / "golden"
QUIET: dict[str, Any] = dict(progress=None, notify=lambda line: None)
#: run.json keys that vary between machines and runs without changing a result
VOLATILE = {"wall_seconds", "versions", "source", "device", "spectrum_seconds", "timings"}
#: perturbed runs behind the tolerances, and their relative size: one float32 rounding (2⁻²³)
PERTURBATIONS = 16
AMPLITUDE = 2.0**-23

Outputs = dict[str, dict[str, bytes]]


def cases(model: str, corpus: str) -> dict[str, Callable[[Path], object]]:
    """Each case: a name and a function running it into a given directory."""
    import spectra

    every = ["svd", "jl", "linformer", "pool-mean", "pool-max", "performer", "nystrom", "nystrom-iter6", "skyformer",
             "probsparse"]
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


def outputs(run_dir: Path, root: Path) -> dict[str, bytes]:
    """What a finished run wrote: every file's bytes, run.json scrubbed (see `_scrub`)."""
    found = {}
    for path in sorted(run_dir.iterdir()):
        if path.name == "run.json":
            meta = _scrub(json.loads(path.read_text()), str(root))
            found[path.name] = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
        else:
            found[path.name] = path.read_bytes()
    return found


def inputs(root: Path) -> tuple[str, str]:
    """The tiny model and corpus every case reads, written under `root`."""
    import tiny

    model = tiny.save_model(root / "models" / "tiny-roberta", "roberta")
    (root / "data").mkdir(parents=True, exist_ok=True)
    corpus = tiny.write_text(root / "data" / "corpus.txt", count=200)
    return str(model), str(corpus)


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
    model, corpus = inputs(root)
    context = contextlib.nullcontext()
    if perturbation is not None:
        perturb_model(model, perturbation, amplitude)
        context = perturbed_synthetic(perturbation, amplitude)
    results = {}
    with context:
        for name, run in cases(model, corpus).items():
            run(root / "runs" / name)
            results[name] = outputs(root / "runs" / name, root)
    return results


def fresh(perturbation: int | None = None) -> Outputs:
    """`make` in a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        return make(Path(tmp), perturbation)


def read(folder: Path) -> Outputs:
    """Outputs stored as folder/<case>/<file> (a golden baseline or a snapshot), without tolerances.json."""
    return {case.name: {path.name: path.read_bytes() for path in sorted(case.iterdir())
                        if path.name != tolerances.FILE}
            for case in sorted(folder.iterdir()) if case.is_dir()}


def write(folder: Path, results: Outputs) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    for case, files in results.items():
        (folder / case).mkdir(parents=True)
        for name, content in files.items():
            (folder / case / name).write_bytes(content)


def regenerate() -> None:
    """tests/golden/: this machine's outputs, and tolerances derived from PERTURBATIONS perturbed runs; prints
    where the previous baseline lies beyond the new tolerances (only the numbers meant to change should)."""
    results = fresh()
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
    write(GOLDEN, results)
    for case, spec in derived.items():
        (GOLDEN / case / tolerances.FILE).write_text(tolerances.dumps(spec) + "\n")
    print(f"wrote {sum(len(files) for files in results.values())} files and their tolerances under {GOLDEN}")


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
    args = parser.parse_args(argv)
    if args.snapshot:
        write(args.snapshot, fresh())
        print(f"snapshot written to {args.snapshot}; after your change: python tests/regression.py --compare "
              f"{args.snapshot}")
        return 0
    if args.compare:
        return 1 if compare(args.compare) else 0
    regenerate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
