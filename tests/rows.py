"""A table whose rows come and go under the perturbations (task_evicted.csv lists the examples a press failed where
the full cache answered, so a flipped answer adds or removes a row): its rows named by their label columns, aligned
to the baseline's, and the rule saying which rows may be missing or extra (see tolerances.py, **rows**)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Table = dict[str, np.ndarray]
#: the label columns that name a row, in a table whose rows the perturbations add or remove
ROW_KEYS = ("method", "press", "ratio", "budget", "example", "sequence", "layer", "head", "kv_head", "task", "n")


def row_names(table: Table) -> list[str] | None:
    """Each row's name from its ROW_KEYS columns, e.g. "'knorm'|0.5|3|'qa_1'" (None for a table without them)."""
    columns = [column for column in table if column in ROW_KEYS]
    if not columns or any(table[column].ndim != 1 for column in columns):
        return None
    return ["|".join(repr(table[column][i].item() if hasattr(table[column][i], "item") else table[column][i])
                     for column in columns) for i in range(len(table[columns[0]]))]


def aligned(other: Table, names: list[str], base: Table) -> Table:
    """`other`'s rows in the order of `base`'s row `names`; a row `other` lacks takes the base's values."""
    where = {name: i for i, name in enumerate(row_names(other) or [])}
    picks = np.array([where.get(name, -1) for name in names], dtype=int)
    found = {}
    for column, values in base.items():
        theirs = other[column]
        found[column] = (np.where(picks >= 0, theirs[np.maximum(picks, 0)], values) if len(theirs) and len(picks)
                         else values.copy())
    return found


def derive(name: str, table: Table, others: list[Table]) -> tuple[dict[str, Any] | None, list[Table]]:
    """The rows rule of a table whose rows the perturbed runs add or remove (None when none does), and the
    perturbed tables aligned to the baseline's rows."""
    names = row_names(table) if name.endswith(".csv") else None
    length = len(next(iter(table.values()))) if table else 0
    if all(list(other) == list(table) and (len(next(iter(other.values()))) if other else 0) == length
           and (names is None or row_names(other) == names) for other in others):
        return None, others
    if names is None or len(set(names)) != len(names) or any(list(other) != list(table) for other in others):
        raise ValueError(f"{name}: a perturbed run changed the rows, and {ROW_KEYS} do not name them")
    optional: set[str] = set()
    for other in others:
        optional |= set(names) ^ set(row_names(other) or [])
    rule = {"key": [column for column in table if column in ROW_KEYS], "optional": sorted(optional),
            "reason": (f"rows that some of {len(others)} perturbed runs lacked or added (an outcome that flips) "
                       "may be missing or extra; the others must be there, in this order")}
    return rule, [aligned(other, names, table) for other in others]


def check(name: str, got: Table, want: Table, rule: Mapping[str, Any]) -> tuple[list[str], Table, np.ndarray]:
    """A rows rule: the problems with `got`'s rows, `got` aligned to the baseline's rows, and which of the
    baseline's rows `got` holds (those the column rules compare)."""
    names, theirs = row_names(want) or [], row_names(got)
    if theirs is None:
        return [f"{name}: no row labels {rule['key']}"], got, np.zeros(len(names), dtype=bool)
    optional, problems = set(rule["optional"]), []
    missing = [row for row in names if row not in theirs and row not in optional]
    extra = [row for row in theirs if row not in names and row not in optional]
    for rows, what in ((missing, "missing"), (extra, "extra")):
        if rows:
            problems.append(f"{name}: rows {', '.join(rows)} are {what} (the perturbations only add or remove "
                            f"{', '.join(sorted(optional)) or 'none'})")
    if [row for row in theirs if row in names] != [row for row in names if row in theirs]:
        problems.append(f"{name}: the rows {rule['key']} are in another order than the baseline's")
    return problems, aligned(got, names, want), np.array([row in theirs for row in names], dtype=bool)
