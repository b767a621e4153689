"""A fixed set of tiny runs through the public API, and their outputs as files: the regression baseline.

`make(root)` runs every analysis (analyze in pack and truncate mode, approx with every method family and
end to end, theorems on a model and on synthetic q, k, v) on a tiny RoBERTa built from a config, and
`outputs(run_dir)` reads back what a run wrote: every table and array file byte for byte, and run.json
without what legitimately varies (timings, versions, paths, the device). tests/test_regression.py
compares them with tests/golden/; a refactor must leave them bitwise unchanged.

Regenerate the baseline only for a change that is meant to change numbers, and say why in the commit:

    python tests/regression.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

GOLDEN = Path(__file__).parent / "golden"
QUIET: dict[str, Any] = dict(progress=None, notify=lambda line: None)
#: run.json keys that vary between machines and runs without changing a result
VOLATILE = {"wall_seconds", "versions", "source", "device", "spectrum_seconds", "timings"}


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
        "approx-all": lambda out: spectra.approx(model, corpus, budgets=[4, 12], methods=every, length=24, samples=6,
                                                 batch_size=4, end_to_end=True, fixed_projection=True, out=out,
                                                 **QUIET),
        "approx-draws": lambda out: spectra.approx(model, corpus, budgets=[4, 12], methods=["jl", "linformer",
                                                   "performer"], length=24, samples=5, batch_size=2, seed=1, out=out,
                                                   **QUIET),
        "approx-orthogonal-truncate": lambda out: spectra.approx(model, corpus, budgets=[3, 8],
                                                                 methods=["jl", "linformer(kv)", "pool-max"],
                                                                 projection="orthogonal", mode="truncate", length=24,
                                                                 samples=5, batch_size=2, end_to_end=True, layers="1",
                                                                 target=0.3, seed=2, fixed_projection=True,
                                                                 out=out, **QUIET),
        "theorems-model": lambda out: spectra.theorems(model, corpus, budgets=[4, 8], eps=[0.3, 0.5], length=24,
                                                       samples=4, batch_size=2, fixed_projection=True, out=out,
                                                       **QUIET),
        "theorems-draws": lambda out: spectra.theorems(model, corpus, budgets=[4, 8], eps=[0.3, 0.5], length=24,
                                                       samples=5, batch_size=2, draws=2, out=out, **QUIET),
        "theorems-synthetic": lambda out: spectra.theorems(None, synthetic=True, budgets=[4, 16], eps=[0.2, 0.5],
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
    sys.path.insert(0, str(Path(__file__).parent))
    import tiny

    model = tiny.save_model(root / "models" / "tiny-roberta", "roberta")
    (root / "data").mkdir(parents=True, exist_ok=True)
    corpus = tiny.write_text(root / "data" / "corpus.txt", count=200)
    return str(model), str(corpus)


def platform() -> str:
    """What bitwise equality depends on: torch and numpy builds and the CPU's vector instructions."""
    import numpy
    import torch

    return f"torch {torch.__version__}, numpy {numpy.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}\n"


def make(root: Path) -> dict[str, dict[str, bytes]]:
    """Run every case under `root`; returns {case: {file: bytes}}."""
    import torch

    torch.set_num_threads(1)  # the baseline must not depend on how many cores split the batched SVDs
    model, corpus = inputs(root)
    results = {}
    for name, run in cases(model, corpus).items():
        run(root / "runs" / name)
        results[name] = outputs(root / "runs" / name, root)
    return results


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results = make(Path(tmp))
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for name, files in results.items():
        (GOLDEN / name).mkdir(parents=True)
        for file, content in files.items():
            (GOLDEN / name / file).write_bytes(content)
    (GOLDEN / "PLATFORM").write_text(platform())
    print(f"wrote {sum(len(files) for files in results.values())} files under {GOLDEN}")


if __name__ == "__main__":
    main()
