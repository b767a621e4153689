"""Does a head's spectrum predict what a press can take from it? The bridge from an analyze run to task runs.

    spectra analyze $GGUF --data more-licenses.txt --length 1024 --samples 4 --out runs/analyze
    spectra tasks $GGUF --tasks niah_single_2,niah_multikey_1 --length 1024 --samples 4 --out tasks.jsonl
    spectra evaluate $GGUF --data tasks.jsonl --presses "snapkv,adakv(snapkv),headbudget(runs/analyze@rank)" \\
        --ratios 0.5,0.875 --out runs/tasks
    python analyses/bridge.py runs/analyze runs/tasks [--over answered] [--csv bridge.csv] [--out bridge.png]

Printed: per press, ratio and spectrum measure (c at n/4, rank for 90%, entropy, sink mass, key rank before and
after RoPE, per layer × key/value head), Spearman's ρ between the measure and the head's needle survival over the
questions the full cache answered, with its 95% interval over the questions (`spectra.report.bridge`); then the
spectrum-set budget (every `headbudget(…)` press of the runs) against AdaKV and SnapKV at each ratio: both scores,
the paired difference [95% interval] and whether every example stored the same bytes. Written: the per-head table
(`--csv`) and the picture of the correlations (`--out`, PNG and PDF).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

import spectra
from spectra.errors import SpectraError
from spectra.report import leaderboard
from spectra.report.bridge import MEASURES, REFERENCES, budget_comparison, correlations, draw, join, table
from spectra.report.console import out, print_frame
from spectra.report.evaluate import with_interval
from spectra.report.plots import style


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("analysis", help="An analyze (or heads) run of the model.")
    parser.add_argument("tasks", nargs="+", help="Task runs (spectra evaluate) of the same model and task file.")
    parser.add_argument("--over", default="answered", choices=list(leaderboard.FILTERS),
                        help="The questions read: those the full cache answered (default), the held tasks', all.")
    parser.add_argument("--against", default=",".join(REFERENCES), help="The presses the headbudget is compared with.")
    parser.add_argument("--csv", default=None, help="Also write the per-head table here.")
    parser.add_argument("--out", default=None, help="Draw the correlations here (PNG and PDF).")
    args = parser.parse_args(argv)
    try:
        analysis = spectra.load_run(args.analysis)
        runs = [spectra.load_run(path) for path in args.tasks]
        bridge = join(analysis, runs, args.over)
        found = correlations(bridge)
        rows = leaderboard.chosen(leaderboard.pooled(runs), leaderboard.HOLDS, args.over)
        budgets = [press for press in dict.fromkeys(rows["press"]) if press.startswith("headbudget(")]
        compared = [budget_comparison(rows, press, args.against.split(","), bridge.seed) for press in budgets]
    except SpectraError as error:
        print(f"error: {error.for_cli()}", file=sys.stderr)
        return 2
    questions = len(bridge.records)
    out.print("Spearman's ρ between each head's spectrum measure and the share of the needle a press kept there, "
              f"over {questions} questions [95% interval over the questions; blank: every compressed head kept as "
              "much of it]; the measures: " +
              "; ".join(f"{name}, {MEASURES[name][2]}" for name in dict.fromkeys(found["measure"])))
    for (press, ratio), mine in found.groupby(["press", "ratio"], sort=False):
        shown = pd.DataFrame({"measure": mine["measure"],
                              "ρ [95%]": [with_interval(*v, sign="+") for v in zip(mine["rho"], mine["low"],
                                                                                     mine["high"])],
                              "replicates": mine["replicates"]})
        print_frame(shown, f"{style.press_label(press, 60)} at r = {ratio:g}, {int(mine['heads'].iloc[0])} heads "
                    "compressed")
    for frame in compared:
        shown = pd.DataFrame({"r": frame["ratio"], "against": frame["reference"],
                              "scores": [f"{a:.2f} / {b:.2f}" for a, b in zip(frame["score"],
                                                                              frame["reference_score"])],
                              "Δ [95%]": [with_interval(*v, sign="+") for v in
                                          zip(frame["delta"], frame["delta_low"], frame["delta_high"])],
                              "bytes": [f"{a:.3f} {'=' if same else '≠'} {b:.3f}" for a, b, same in
                                        zip(frame["bytes_share"], frame["reference_bytes_share"],
                                            frame["same_bytes"])]})
        print_frame(shown, f"{style.press_label(frame['press'].iloc[0], 60)} against each reference on "
                    f"{int(frame['examples'].iloc[0])} examples: the scores (its / theirs), the paired difference "
                    "[95% interval], "
                    "and the shares of the cache's bytes stored ('=': the same bytes on every example)",
                    digits={"r": 3})
        unequal = frame[~frame["same_bytes"]]
        if len(unequal):
            out.print("not at equal bytes: " + ", ".join(f"{reference} at r = {ratio:g}" for reference, ratio in
                                                         zip(unequal["reference"], unequal["ratio"])))
    if args.csv:
        table(bridge).to_csv(args.csv, index=False)
    if args.out:
        paths = style.save(draw(found, f"{analysis.meta['model']['name']}: does a head's spectrum predict the needle "
                                f"a press keeps there? {questions} questions"), args.out)
        out.print("drawn: " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
