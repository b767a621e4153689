"""What of a ranking transfers between models: the same presses on the same needles with two models.

    spectra tasks $SMOL --tasks niah_single_2,niah_single_3,niah_multikey_1,niah_single_1,passkey --length 1024 \\
        --samples 50 --out smol.jsonl
    spectra tasks $GEMMA --tasks niah_single_2,niah_single_3,niah_multikey_1,niah_single_1,passkey --length 1024 \\
        --samples 50 --out gemma.jsonl
    spectra evaluate $SMOL --data smol.jsonl --presses snapkv,keydiff --ratios 0.5,0.875 --out runs/smol
    spectra evaluate $GEMMA --data gemma.jsonl --presses snapkv,keydiff --ratios 0.5,0.875 --out runs/gemma
    python analyses/models.py --first runs/smol --second runs/gemma [--csv models.csv] [--out models.png]

The two task files (one per tokenizer, the same --tasks order, --length, --samples, --seed and haystacks) hide the
same needles; each arm may be several runs of its model (pooled as the leaderboard pools them). Printed: per task
each model's full-cache score (the tasks both hold at least 0.8 are compared); per press and ratio both scores with
95% intervals, the paired difference second − first, each model's verdict against its own full cache (holds: the
paired difference from it reaches 0; loses: it lies below) and whether it flips; each press's mean over the ratios
and rank on each model, and Kendall's τ between the rankings with its interval (`spectra.report.models`,
`spectra.report.arms`). Written: the per-cell table (`--csv`) and the two models' means against each other (`--out`).
"""

from __future__ import annotations

import argparse
import sys

import spectra
from spectra.errors import SpectraError
from spectra.report import leaderboard
from spectra.report.arms import compared, ranked, shown, tau_text
from spectra.report.console import out, print_frame
from spectra.report.models import draw, paired
from spectra.report.plots import style


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", nargs="+", required=True, help="Task runs of the first model.")
    parser.add_argument("--second", nargs="+", required=True, help="Task runs of the second model (same needles).")
    parser.add_argument("--csv", default=None, help="Also write the per-cell table here.")
    parser.add_argument("--out", default=None, help="Draw the two models' means against each other here (PNG, PDF).")
    args = parser.parse_args(argv)
    try:
        first, second = ([spectra.load_run(path) for path in paths] for paths in (args.first, args.second))
        pair = paired(first, second)
        seed = leaderboard.seed_of(first)
        table, (order, tau) = compared(pair.rows, seed, pair.arms), ranked(pair.rows, seed, pair.arms)
    except SpectraError as error:
        print(f"error: {error.for_cli()}", file=sys.stderr)
        return 2
    one, two = pair.arms
    base = pair.baseline.pivot(index="task", columns="model", values="full").reindex(columns=list(pair.arms))
    base["examples"] = pair.baseline.groupby("task")["examples"].min()
    base["compared"] = pair.baseline.groupby("task")["held"].first().map({True: "yes", False: "no"})
    print_frame(base.reset_index(), f"the full cache's score per task on each model (compared: both ≥ "
                f"{leaderboard.HOLDS:g})", digits={one: 2, two: 2})
    print_frame(shown(table, pair.arms), f"the same {int(table['examples'].iloc[0])} needles on both models: the score "
                "per press and ratio [95% interval], the paired difference, and each model's verdict against its own "
                "full cache",
                digits={"ratio": 3, "changed": 2})
    print_frame(order, "each press's mean over the ratios and its rank on each model",
                digits={f"{one}_score": 2, f"{two}_score": 2})
    flips = table.loc[table["flips"], ["press", "ratio"]].itertuples(index=False)
    flipped = [f"{press} at r = {ratio:g}" for press, ratio in flips]
    out.print(f"Kendall's τ between the two rankings: {tau_text(tau)} (95% interval over the same bootstrap "
              f"replicates); verdicts that flip: {', '.join(flipped) or 'none'}")
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.out:
        for path in style.save(draw(order, pair.arms, tau, table.loc[table["flips"], "press"]), args.out):
            out.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
