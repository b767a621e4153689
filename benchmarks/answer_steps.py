"""What decoding spends on rows that no longer change a score, from a finished task run's stored answers (RESULTS §34).

    python benchmarks/answer_steps.py RUN TASKS.jsonl MODEL

- shedding: the row-steps a greedy batch computes when it drops its stopped rows once the share still answering falls
  to `share` (`batching.SHED`), against the row-steps the answers need, for 0.5, 0.75, 0.9 and 1 — replayed from the
  answers' lengths (a cell's rows of one example decode as one batch, `--batch-size 1`);
- `--stop-answered`: every answer cut where its decoded token prefix first settles (`scoring.settled`), its score
  against the whole answer's, and the tokens decoded with and without the cut.

RUN: a finished `spectra evaluate` directory (its answers.npz) or a `.partial` one (its checkpoint's done examples);
TASKS: the task file it ran (records indexed by line); MODEL: the model whose tokenizer decodes the answers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from spectra import models
from spectra.kv.tasks.scoring import score, settled


def answers(run: Path) -> tuple[list[list[list[int]]], list[int]]:
    """[cell][example] token ids, and each example's line in the task file."""
    if (run / "answers.npz").exists():
        found = np.load(run / "answers.npz")
        ids, lines = found["ids"], [int(line) for line in found["example"]]
        return [[[int(t) for t in row if t >= 0] for row in cell] for cell in ids], lines
    meta = json.loads((run / "run.json").read_text())
    state = np.load(run / "checkpoint.npz")
    done = np.flatnonzero(state["tasks.done"])
    named = meta["tasks"] or []
    wanted = set(named.split(",") if isinstance(named, str) else named)
    records = [json.loads(line) for line in open(meta["data"]["source"])]
    lines = [i for i, record in enumerate(records) if not wanted or record["task"] in wanted]
    ids = state["tasks.ids"][:, done]  # token id + 1; 0: none
    return [[[int(t) - 1 for t in row if t] for row in cell] for cell in ids], [lines[i] for i in done]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("tasks", type=Path)
    parser.add_argument("model")
    args = parser.parse_args()
    cells, lines = answers(args.run)
    lengths = np.array([[len(row) for row in cell] for cell in cells])  # cells × examples
    need = int(lengths.sum())
    for share in (0.5, 0.75, 0.9, 1.0):
        steps = drops = 0
        for example in range(lengths.shape[1]):
            row_lengths, live = lengths[:, example], lengths.shape[0]
            for step in range(1, int(row_lengths.max()) + 1):
                answering = int((row_lengths >= step).sum())
                if answering < live and answering <= share * live:
                    live, drops = answering, drops + 1
                steps += live
        print(f"shedding at {share:g}: {steps / need:.3f}× the row-steps the answers need, "
              f"{drops / lengths.shape[1]:.1f} drops an example")
    tokenizer = models.load_tokenizer(args.model)
    records = [json.loads(line) for line in args.tasks.read_text().splitlines()]
    total = kept = cut = changed = 0
    for cell in cells:
        for row, line in zip(cell, lines):
            task, references = records[line]["task"], records[line]["answers"]
            references = [references] if isinstance(references, str) else references
            stop = next((t for t in range(1, len(row) + 1)
                         if settled(task, tokenizer.decode(row[:t], skip_special_tokens=True), references)), len(row))
            whole = score(task, tokenizer.decode(row, skip_special_tokens=True), references)
            changed += score(task, tokenizer.decode(row[:stop], skip_special_tokens=True), references) != whole
            total, kept, cut = total + len(row), kept + stop, cut + (stop < len(row))
    print(f"--stop-answered: {len(cells) * len(lines)} answers, {cut} cut, {changed} scores changed; tokens "
          f"{total} -> {kept} ({1 - kept / max(total, 1):.0%} fewer)")


if __name__ == "__main__":
    main()
