"""Compressed cells of several examples waiting to decode together: the order they are compressed in and the groups
`--decode-memory` cuts them into.

The task study decodes the cells of `--batch-size` examples as one batch (`kv.batching`): a greedy step reads all the
model's weights however few rows it answers, and the rows still answering after most have stopped (caches that lost
the needle babble to `max_new_tokens`) are the cost; several examples share that tail. Their caches may not fit in
memory together, so they decode in groups: cells join a group in `order` (the widest first, so cells of like width
share a group and pad little), each compressed just before it joins, until the next would take the group's buffers
(`batching.group_bytes`: padding and room included, one row per question the cell answers) and the rows the cells
hold of their own (`batching.held_bytes`) past the budget; that group decodes and is freed, the next begins. A
group runs as many steps as its longest answer: examples that may answer at length go together, after the others.

On one example the order is the ratio's (every eviction press at one ratio keeps as many rows), as it always was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .batching import group_bytes


@dataclass(frozen=True)
class Waiting:
    """One compressed cell waiting to decode: its example (`owner`, the position among the examples held) and cell
    (an index into the run's cells), the rows its cache occupies per layer (`batching.cell_rows`), the bytes it holds
    of its own (`batching.held_bytes`), its batch rows (one per question its example asks), and the tokens its rows
    need after the context: the tokens of the example's `longest` question and its `max_new_tokens`."""

    owner: int
    cell: int
    rows: Sequence[int]
    held: int
    copies: int
    longest: int
    new_tokens: int


def order(contexts: Sequence[int], ratios: Sequence[float], new_tokens: Sequence[int] | None = None
          ) -> list[tuple[int, int]]:
    """(owner, cell) for every cell of examples of `contexts` tokens (answering in up to `new_tokens`, default
    alike), cells at `ratios` (the full cache at 0): the examples of fewer new tokens first — a group's steps run to
    its longest answer, so a row that may run long (niah's 128) is not spread over the groups of rows that stop soon
    (passkey's 10) —, then the widest first by the rows an eviction press keeps, context × (1 − ratio) — a press
    whose ratio counts bits or channels keeps every row, and only pads its group —, ties by ratio, example and cell
    (on one example: by ratio, the full cache first)."""
    tokens = list(new_tokens) if new_tokens is not None else [0] * len(contexts)
    pairs = [(owner, cell) for owner in range(len(contexts)) for cell in range(len(ratios))]
    return sorted(pairs, key=lambda pair: (tokens[pair[0]], -contexts[pair[0]] * (1 - ratios[pair[1]]),
                                           ratios[pair[1]], *pair))


def room(group: Sequence[Waiting]) -> int:
    """The columns a group's batch keeps per layer after the widest cache: the longest question (the shorter are
    left-padded to it) and the most new tokens any row may produce."""
    return max(waiting.longest for waiting in group) + max(waiting.new_tokens for waiting in group)


class Groups:
    """Cells cut into groups whose buffers and own rows stay within `budget` bytes (`row_bytes`: one column of one
    row, `batching.batch_row_bytes`); a cell that fits nowhere else decodes in a group of its own."""

    def __init__(self, budget: int, row_bytes: int) -> None:
        self.budget, self.row_bytes = budget, row_bytes
        self.group: list[Waiting] = []

    def bytes(self, group: Sequence[Waiting]) -> int:
        """What `group` takes while it decodes: its buffers and the rows its cells hold of their own."""
        rows = [waiting.rows for waiting in group for _ in range(waiting.copies)]
        return group_bytes(rows, room(group), self.row_bytes) + sum(waiting.held for waiting in group)

    def add(self, waiting: Waiting) -> list[Waiting]:
        """Add `waiting`; returns the group to decode first (the one it would take past the budget), else []."""
        full: list[Waiting] = []
        if self.group and self.bytes([*self.group, waiting]) > self.budget:
            full, self.group = self.group, []
        self.group.append(waiting)
        return full

    def rest(self) -> list[Waiting]:
        """The last group (possibly empty), handed over and forgotten."""
        last, self.group = self.group, []
        return last


def cost(examples: int, cells: int, groups: int, seconds: float) -> str:
    """The notice of what the first batch of `examples` examples (`cells` cells each) took after its prefills,
    decoded in `groups` groups."""
    if examples == 1:
        batches = "batch" if groups == 1 else "batches"
        return (f"each example: {cells} cells, compressed and answered in {groups} {batches} "
                f"({seconds:.1f} s after its prefill on the first)")
    return (f"each batch of {examples} examples: {cells} cells each, compressed and answered in "
            f"{groups} {'group' if groups == 1 else 'groups'} ({seconds:.1f} s after their prefills on the first)")
