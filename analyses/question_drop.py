"""What compressing a context once for many questions costs: the drop KVzip reports, measured on one task file.

    spectra tasks $GGUF --tasks niah_multi_questions,kv_retrieval --length 1024 --samples 10 --out many.jsonl
    spectra evaluate $GGUF --data many.jsonl --presses snapkv,knorm --ratios 0.5 --query-aware --out in-view
    spectra evaluate $GGUF --data many.jsonl --presses snapkv,knorm --ratios 0.5 --out once
    python analyses/question_drop.py in-view once [--csv drop.csv]

The first run compresses each question of a record in view on its own (one compression per question); the second
compresses each record's context once, without any question, and answers every question from it (kvpress's
`questions=[…]`). Printed per press, ratio and task: the score with the question in view, the score from one
compression, and the drop between them with its 95% paired bootstrap interval over records
(`spectra.report.evaluate.question_drop`).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

import spectra
from spectra.errors import SpectraError
from spectra.report.console import out, print_frame
from spectra.report.evaluate import question_drop, with_interval


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("in_view", help="A --query-aware task run of a file whose records ask several questions.")
    parser.add_argument("once", help="The query-agnostic task run of the same file.")
    parser.add_argument("--csv", default=None, help="Also write the table here.")
    args = parser.parse_args(argv)
    try:
        table = question_drop(spectra.load_run(args.in_view), spectra.load_run(args.once))
    except SpectraError as error:
        print(f"error: {error.for_cli()}", file=sys.stderr)
        return 2
    out.print("per press and ratio: the score with the question in view (one compression per question), from one "
              "compression for every question, and the drop [95% interval over records]")
    for task, mine in table.groupby("task", sort=False):
        shown = pd.DataFrame({"press": mine["press"], "ratio": mine["ratio"], "in view": mine["in_view"],
                              "once": mine["once"],
                              "drop": [with_interval(*values, sign="+") for values in
                                       zip(mine["drop"], mine["drop_low"], mine["drop_high"])]})
        print_frame(shown, f"{task}, {int(mine['questions'].max())} questions",
                    digits={"ratio": 2, "in view": 2, "once": 2})
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
