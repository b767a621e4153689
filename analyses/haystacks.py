"""What a leaderboard's haystack does to it: the same presses on the same needles in RULER's noise and in prose.

    spectra tasks $GGUF --tasks niah_single_2,niah_single_3,niah_multikey_1 --length 1024 --samples 50 --out prose.jsonl
    spectra tasks $GGUF --tasks niah_single_2,niah_single_3,niah_multikey_1 --length 1024 --samples 50 \\
        --haystack noise --out noise.jsonl
    spectra evaluate $GGUF --data prose.jsonl --presses snapkv,keydiff --ratios 0.5,0.875 --out runs/prose
    spectra evaluate $GGUF --data noise.jsonl --presses snapkv,keydiff --ratios 0.5,0.875 --out runs/noise
    python analyses/haystacks.py --noise runs/noise --prose runs/prose [--csv haystacks.csv]

The two task files hide the same needles (keys, values, depths) and differ only in the haystack; the prose arm may
hold more records (a leaderboard's file whose first tasks are the noise file's), and each arm may be several runs
of its file (pooled as the leaderboard pools them). Printed: per press and ratio the score on noise and on prose
with 95% intervals, the paired difference prose − noise [95% interval over the needles, task-stratified], the share
of needles whose score changed, and each haystack's verdict against its own full cache; then each press's mean over
the ratios and rank on each haystack, and Kendall's τ between the two rankings with its interval
(`spectra.report.haystacks`, `spectra.report.arms`).
"""

from __future__ import annotations

import argparse
import sys

import spectra
from spectra.errors import SpectraError
from spectra.report import leaderboard
from spectra.report.console import out, print_frame
from spectra.report.arms import compared, ranked, shown, tau_text
from spectra.report.haystacks import ARMS, paired


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", nargs="+", required=True, help="Task runs of the file whose essays read noise.")
    parser.add_argument("--prose", nargs="+", required=True, help="Task runs of the file whose essays read prose.")
    parser.add_argument("--csv", default=None, help="Also write the per-cell table here.")
    args = parser.parse_args(argv)
    try:
        noise, prose = ([spectra.load_run(path) for path in paths] for paths in (args.noise, args.prose))
        rows = paired(noise, prose)
        seed = leaderboard.seed_of(noise)
        table, (order, tau) = compared(rows, seed, ARMS), ranked(rows, seed, ARMS)
    except SpectraError as error:
        print(f"error: {error.for_cli()}", file=sys.stderr)
        return 2
    print_frame(shown(table, ARMS), f"the same {int(table['examples'].iloc[0])} needles in noise and in prose: the "
                "score per press and ratio [95% interval], the paired difference, and each haystack's verdict against "
                "its own full cache", digits={"ratio": 3, "changed": 2})
    print_frame(order, "each press's mean over the ratios and its rank on each haystack",
                digits={"noise_score": 2, "prose_score": 2})
    out.print(f"Kendall's τ between the two rankings: {tau_text(tau)} (95% interval over the same bootstrap "
              "replicates)")
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
