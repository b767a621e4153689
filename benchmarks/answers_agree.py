"""Whether two devices (or process layouts) give a task run the same answers: a task run's checkpoint from one (its
`.partial` folder, e.g. a GPU run stopped early) against the finished run of the same command from another, on
the records both hold.

    python benchmarks/answers_agree.py PARTIAL FINISHED

PARTIAL's answers are its checkpoint's token ids (`tasks.ids`, id + 1, 0 for none), decoded with the model's tokenizer
(special tokens dropped, as the run's own tables decode them) and scored with `spectra.kv.tasks.scoring.score`
against the records' answers. FINISHED is read from its `task_examples.csv`. Printed: the share of (cell, question)
answers that are the same string and that get the same score, overall and for the full cache; where the differing
answers sit, per ratio and per press; and, for a run resumed in several processes, the records before and after a
given one (`--split`, the record the processes took over at). Used for benchmarks/RESULTS.md, section 23.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from transformers import AutoTokenizer


def tokenizer_of(meta: dict):
    """The tokenizer of the run's model: a GGUF file's folder and name, or a model folder."""
    source = Path(meta["model"]["source"])
    if source.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    return AutoTokenizer.from_pretrained(source)


def compare(partial: Path, finished: Path) -> pd.DataFrame:
    """One row per (cell, question) of the records the checkpoint holds: press, ratio, example, question, whether
    the answers are the same string and whether they score the same."""
    from spectra.kv.tasks.scoring import score

    meta = json.loads((finished / "run.json").read_text())
    state = np.load(partial / "checkpoint.npz")
    ids, records = state["tasks.ids"], int(state["tasks.done"].sum())
    table = pd.read_csv(finished / "task_examples.csv", keep_default_na=False)
    cells = list(dict.fromkeys(zip(table["press"], table["ratio"])))
    if len(cells) != ids.shape[0]:
        raise SystemExit(f"{partial} holds {ids.shape[0]} cells, {finished} {len(cells)}: not the same command")
    # the records in the task file's order: a run of all its records (no --samples subset), whose checkpoint holds
    # the first ones
    order = list(dict.fromkeys(table["example"]))[:records]
    lines = Path(meta["data"]["source"]).read_text().splitlines()
    records_read = [json.loads(lines[position]) for position in range(len(order))]
    # a many-question record holds a list of answers per question; a single-question one, one list
    answers = {example: record["answers"] if "questions" in record else [record["answers"]]
               for example, record in zip(order, records_read)}
    tokenizer = tokenizer_of(meta)
    rows = []
    for cell, (press, ratio) in enumerate(cells):
        block = table[(table["press"] == press) & (table["ratio"] == ratio) & table["example"].isin(order)]
        for item, row in enumerate(block.itertuples()):  # items in record order, each record's questions in order
            answer = tokenizer.decode([int(token) - 1 for token in ids[cell, item] if token], skip_special_tokens=True)
            expected = answers[row.example][row.question]
            rows.append({"press": press, "ratio": ratio, "example": row.example, "question": row.question,
                         "record": order.index(row.example), "same": answer == row.prediction,
                         "same_score": score(row.task, answer, expected) == row.score})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("partial", type=Path, help="the .partial folder of the run stopped early")
    parser.add_argument("finished", type=Path, help="the finished run of the same command")
    parser.add_argument("--split", type=int, default=None, help="count the records before and from this one apart")
    args = parser.parse_args()
    rows = compare(args.partial, args.finished)
    full = rows[rows["press"] == "full"]
    differ = rows[~rows["same"]]
    print(f"{rows['record'].nunique()} records, {len(rows)} answers: the same string {int(rows['same'].sum())} "
          f"({rows['same'].mean():.4f}), the same score {int(rows['same_score'].sum())} "
          f"({rows['same_score'].mean():.4f}); the full cache {int(full['same'].sum())} of {len(full)}")
    print("differing answers per ratio:", differ.groupby("ratio").size().to_dict())
    print("differing answers per press (most):", differ.groupby("press").size().nlargest(5).to_dict())
    if args.split is not None:
        for name, part in (("before", rows[rows["record"] < args.split]), ("from", rows[rows["record"] >= args.split])):
            print(f"records {name} {args.split}: {int((~part['same']).sum())} of {len(part)} answers differ")


if __name__ == "__main__":
    main()
