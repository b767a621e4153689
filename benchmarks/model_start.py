"""A GGUF model's start with and without the cache of its dequantized weights (issue 55, item 6).

    python benchmarks/model_start.py MODEL.gguf

Times `spectra.models.load` to a loaded model three ways, in one process: without the cache (`--no-model-cache`'s
path: the GGUF dequantized), the first start with it (dequantized once and written to a fresh cache directory), and
the second start (read back from it); prints the seconds of each, the cache entry's size on disk, and whether the
three models' weights are bitwise equal. The cache directory is a temporary one (`SPECTRA_CACHE`), removed after.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def timed(load) -> tuple[float, object]:
    started = time.perf_counter()
    loaded = load()
    return time.perf_counter() - started, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", help="a .gguf file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        os.environ["SPECTRA_CACHE"] = folder
        import torch

        from spectra import modelcache, models

        def load(cached: bool):
            with modelcache.using(cached):
                return models.load(args.gguf, lm_head=True)

        plain_seconds, plain = timed(lambda: load(False))
        first_seconds, first = timed(lambda: load(True))
        second_seconds, second = timed(lambda: load(True))
        size = sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())
        same = all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(
            plain.model.state_dict().values(), first.model.state_dict().values(), second.model.state_dict().values()))
        print(f"{Path(args.gguf).name}: without the cache {plain_seconds:.1f} s, first start {first_seconds:.1f} s, "
              f"second start {second_seconds:.1f} s; cache {size / 2**20:.0f} MiB; weights bitwise equal: {same}")


if __name__ == "__main__":
    main()
