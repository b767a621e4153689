"""Spectrum-guided per-layer ratio schedules for `spectra cache` (issue 22 part 3): derive them from an analyze run, export
them as kvpress's PerLayerCompressionPress lists, and measure them against the uniform ratio and PyramidKV's
schedule at equal total cache.

    python analyses/schedules.py ANALYZE_RUN --ratios 0.5,0.75 --out schedules/           # the lists only
    python analyses/schedules.py ANALYZE_RUN --ratios 0.5,0.75 --out schedules/ \\
        --model MODEL --data licenses.txt --context 512 --continuation 64 --samples 4  # and a cache run

ANALYZE_RUN is a finished `spectra analyze` run of the same model (metrics.csv with sink and entropy, qkv.csv with
pca_rank90). For each schedule (uniform, pyramid, and one per measure in `spectra.kv.presses.schedules.MEASURES`) and
ratio, `OUT/<schedule>-<ratio>.json` holds the per-layer ratios for L = --context, and `OUT/schedules.csv` all of
them in one tidy table. With --model, the base press (default snapkv) runs under every schedule in one `spectra
cache` run written to OUT/cache: the scheduled presses are registered for this process only (`spectra cache` has no
option for per-layer ratio schedules yet).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

import spectra
from spectra.kv import presses
from spectra.kv.presses.base import facts
from spectra.kv.presses.schedules import MEASURES, Scheduled, export, layer_weights, pyramid, spectral, uniform


def schedules(run, layers: int) -> dict[str, object]:
    """Schedule name → schedule: uniform, pyramid and one spectral schedule per measure the run holds."""
    found = {"uniform": uniform(layers), "pyramid": pyramid(layers)}
    for measure in MEASURES:
        try:
            weights = layer_weights(measure, run.metrics, run.qkv)
        except ValueError as error:
            print(f"skipped {measure}: {error}", file=sys.stderr)
            continue
        found[measure] = spectral(weights)
    return found


def table(chosen: dict[str, object], ratios: list[float], length: int) -> pd.DataFrame:
    rows = [{"schedule": name, "ratio": ratio, "layer": layer, "layer_ratio": value}
            for name, schedule in chosen.items() for ratio in ratios
            for layer, value in enumerate(schedule(ratio, length))]
    return pd.DataFrame(rows)


@contextlib.contextmanager
def registered(scheduled: list[Scheduled]) -> Iterator[None]:
    """The scheduled presses registered inside the block only: `spectra cache` has no option for per-layer ratio
    schedules yet, so this process alone sees them."""
    with presses.REGISTRY.extended({press.name: (press, facts(press)) for press in scheduled}):
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished spectra analyze run of the model")
    parser.add_argument("--ratios", default="0.5,0.75", help="mean compression ratios, comma-separated")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--press", default="snapkv", help="the eviction press the schedules drive")
    parser.add_argument("--model", help="measure the schedules with spectra cache on this model")
    parser.add_argument("--data", default="licenses.txt")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--continuation", type=int, default=128)
    parser.add_argument("--samples", type=int, default=16)
    args = parser.parse_args(argv)
    run = spectra.load_run(args.run)
    ratios = [float(ratio) for ratio in args.ratios.split(",")]
    chosen = schedules(run, run.layers)
    args.out.mkdir(parents=True, exist_ok=True)
    frame = table(chosen, ratios, args.context)
    frame.to_csv(args.out / "schedules.csv", index=False)
    for (name, ratio), rows in frame.groupby(["schedule", "ratio"]):
        export(rows.sort_values("layer")["layer_ratio"].to_list(), args.out / f"{name}-{ratio:g}.json")
    print(frame.pivot_table(index="layer", columns=["schedule", "ratio"], values="layer_ratio").round(3).to_string())
    if args.model is None:
        return 0
    base = presses.REGISTRY[args.press]
    scheduled = [Scheduled(f"{args.press}@{name}", base, schedule) for name, schedule in chosen.items()
                 if name != "uniform"]
    with registered(scheduled):
        measured = spectra.cache(args.model, args.data, context=args.context, continuation=args.continuation,
                                 samples=args.samples, presses=",".join([args.press, *(p.name for p in scheduled)]),
                                 ratios=",".join(str(ratio) for ratio in ratios), out=args.out / "cache",
                                 overwrite=True)
    print(measured.table.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
