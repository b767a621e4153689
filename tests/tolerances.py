"""How far a stored regression output may move on another machine: derived from perturbed runs, then checked.

`derive(files, perturbed, amplitude)` turns one case's outputs and the same case run on perturbed inputs
(regression.py: every weight of the tiny model and every synthetic q, k, v multiplied by 1 + u·2⁻²³,
u ~ U(−1, 1) seeded — a rounding-level change like another machine's kernels make) into the case's
tolerances.json; `check(got, want, spec)` compares outputs with a stored baseline through it. Δ_i is the
largest move of cell i over the perturbed runs; the rules:

- **exact**: run.json (scrubbed of timings and versions) and every other file that is not a table, every
  non-float column (labels such as method, layer, head; counts such as `samples`) and integer array that the
  perturbations never move, and the columns, rows and their order. A file that is not a table and moves under
  the perturbations stops the derivation: it needs a rule.
- **continuous** float columns and arrays: |got − want| ≤ atol + rtol·|want| (NaN only where NaN), with
  SAFETY·Δ_i ≤ atol + rtol·|x_i| on every cell — per column, and per method (or per press) where the table has
  one, so a method that amplifies rounding by its own conditioning (skyformer's near-zero normaliser, nystrom's
  ill-conditioned A, svd at a rank where σ_k ≈ σ_k+1), or a press whose choice of tokens breaks a tie by
  rounding (knorm: a token repeated in layer 0 has one key norm at every position, RoPE being a rotation),
  does not loosen the others. Of the pairs that cover
  every cell the one tightest at the column's median magnitude is kept: relative for most columns, absolute
  for differences near zero (ppl_change, mean_low), whose error is that of the numbers they subtract.
  Floors, what the computation guarantees anyway: rtol ≥ 1e-6 (float32 forward passes, ~1e-7 per
  operation), c within 2e-6 (each machine within 1e-6 of a float64 SVD of its P), and rtol 1e-12 for a
  column the perturbations never move (a count or a formula of the settings: another libm may still round
  its last bit); for such a column the check also allows rtol of the column's largest magnitude (an atol of
  rtol·max|x|): a value zero in theory, an exponent fitted on a constant (~1e-16), rounds at its column's scale
  (it moved 4e-17 between the baseline's machine and another).
- **cells** for the discrete columns — success rates (`pr*`: Pr(err ≤ ε) and its interval), histogram
  quantiles (`median`, `p95`: bin edges of a 100-per-decade histogram, or the clipped min/max) and the rank
  counts' moments (`rank90_*`, `rank99_*`) — which move only where a sample sits within rounding of a
  threshold or a bin edge, and then by a whole step. The perturbed runs find those cells: they move the
  outputs about as far as another machine does or further (the old baseline, written on another CPU,
  differs from this machine's outputs by a median 0.25 of the largest perturbed move per column, at most
  1.3×), so a sample within another machine's rounding of a threshold flips in a good share of the 16
  runs, and all of them missing it is unlikely. A cell that moved may move SAFETY times as far as it did
  (its own absolute tolerance); a cell that never moved must agree to 1e-12. The task study's are the
  same kind of number: an example's score and the means and bootstrap intervals over examples (`score`,
  `low`, `high`, `full`, `delta*` in task_*.csv) move only where a greedy answer flips, the needle's share kept
  (`needle_kept*`, `kept`, needle.npz's `survival`) only where a press's choice of tokens does, and the cache
  study's top-1 agreement (`top1`) only where two logits tie within rounding. In these columns a cell whose NaN
  comes and goes under the perturbations (`needle_kept_failed`: no failed example, then one) may hold any value.
- **cells**, too, for an integer column or array that the perturbations move (answers.npz's token `ids`, the
  failed examples per head `failed`), and **flips** for a text column they move (a greedy `prediction`): the
  cells that moved may hold another value, the others must be equal.
- **rows** for a table whose rows come and go with such outcomes (task_evicted.csv lists the examples a press
  failed where the full cache answered): rows are named by their label columns (`rows.ROW_KEYS`); a row that some
  perturbed run lacked or added is optional, every other one must be there, in the baseline's order, and the
  rows both hold are compared by the column rules.

SAFETY = 10: the old baseline sits within 0.12 of these tolerances on every column (nystrom and
skyformer rows aside, whose numbers were meant to change; nystrom's old rows are within 0.15).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import rows

FILE = "tolerances.json"
#: tolerance = SAFETY × the largest move under the perturbations (see the module docstring)
SAFETY = 10.0
#: float32 forward passes: ~1e-7 relative per operation, a few dozen of them
FLOAT32_RTOL = 1e-6
#: a float64 formula or sum that the data does not move: another libm may round its last bit differently
FORMULA_RTOL = 1e-12
#: c (the normalized cumulative singular value) from two machines: each within 1e-6 of a float64 SVD (the only mode)
C_ATOL = {"exact": 2e-6}
C_COLUMNS = ("cum_mean", "cum_std", "c_at_mean", "c_at_std")
DISCRETE = ("pr", "pr_below_target", "pr_mean", "pr_low", "pr_high", "pr_draw_std", "median", "p95", "rank90_mean",
            "rank90_std", "rank99_mean", "rank99_std")
#: discrete in the task study's tables (task_*.csv) only: theorems' `delta` is a setting, not a score difference
TASK_DISCRETE = ("score", "low", "high", "full", "delta", "delta_low", "delta_high", "needle_kept",
                 "needle_kept_failed", "kept")
#: discrete too, with what makes them step (their tolerances' reason)
STEPS = {"top1": "an argmax between two logits within rounding", "survival": "a press's choice of tokens"}
TASK_STEPS = "an example's greedy answer or a press's choice of tokens"
#: the column whose labels get tolerances of their own (the first a table has)
GROUPS = ("method", "press")

Table = dict[str, np.ndarray]


def _up(value: float) -> float:
    """`value` rounded up to two significant digits (a tolerance written to the file is never below its fit)."""
    if value <= 0 or not np.isfinite(value):
        return float(value)
    scale = 10.0 ** (np.floor(np.log10(value)) - 1)
    return float(f"{np.ceil(value / scale - 1e-9) * scale:.2g}")


def dumps(spec: Any, indent: int = 0) -> str:
    """JSON with one line per innermost object (a column's or a group's numbers), for readable diffs."""
    pad = " " * indent
    if isinstance(spec, dict) and any(isinstance(value, (dict, list)) and value for value in spec.values()):
        items = [f'{pad} {json.dumps(key)}: {dumps(value, indent + 1).lstrip()}' for key, value in spec.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return pad + json.dumps(spec, ensure_ascii=False)


def _tables(files: Mapping[str, bytes]) -> dict[str, Table]:
    """Every table and array file as {column or array name: values}; CSV labels stay as read."""
    found: dict[str, Table] = {}
    for name, content in files.items():
        if name.endswith(".csv"):
            frame = pd.read_csv(io.BytesIO(content))
            found[name] = {column: frame[column].to_numpy() for column in frame.columns}
        elif name.endswith(".npz"):
            with np.load(io.BytesIO(content), allow_pickle=False) as arrays:
                found[name] = {key: arrays[key] for key in arrays.files}
    return found


def _is_float(values: np.ndarray) -> bool:
    return values.dtype.kind == "f"


def _moves(base: np.ndarray, perturbed: Sequence[np.ndarray], where: str, discrete: bool = False) -> np.ndarray:
    """Largest |x' − x| per cell over the perturbed runs (0 where both are the same NaN or infinity; in a discrete
    column, infinite where a NaN came or went)."""
    moves = np.zeros(base.shape)
    for other in perturbed:
        came = np.isnan(other) != np.isnan(base)
        if other.shape != base.shape or (came.any() and not discrete) \
                or not np.array_equal(other[np.isinf(other)], base[np.isinf(base)]):
            raise ValueError(f"{where}: a perturbed run changed the shape, the NaN or the infinite cells")
        finite = np.isfinite(base) & ~came
        moves[finite] = np.maximum(moves[finite], np.abs(other[finite] - base[finite]))
        moves[came] = np.inf
    return moves


def _changed(base: np.ndarray, perturbed: Sequence[np.ndarray], where: str) -> np.ndarray:
    """Which cells of a non-float column any perturbed run changed (NaN equal to NaN)."""
    changed = np.zeros(base.shape, dtype=bool)
    for other in perturbed:
        if other.shape != base.shape:
            raise ValueError(f"{where}: a perturbed run changed the shape")
        changed |= ~_equal(other, base)
    return changed


def _equal(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Cell by cell equality of two columns of any type, a missing value (NaN) equal to another."""
    return np.asarray((got == want) | (pd.isna(got) & pd.isna(want)), dtype=bool)


def _fit(base: np.ndarray, moves: np.ndarray, rtol_floor: float, atol_floor: float) -> dict[str, float]:
    """rtol and atol with SAFETY·Δ_i ≤ atol + rtol·|x_i| for every finite cell: of the pairs that cover every cell
    (atol one of the SAFETY·Δ_i or 0, rtol the least that covers the rest) the one whose tolerance at the
    column's median magnitude is smallest — relative for most columns, absolute for differences near zero."""
    finite = np.isfinite(base)
    size, moves = np.abs(base[finite]), SAFETY * moves[finite]
    if not moves.any():
        return {"rtol": FORMULA_RTOL, "atol": atol_floor, "moved": 0.0}
    typical = float(np.median(size)) or float(size.max())
    best = (np.inf, 0.0, 0.0)
    for atol in np.unique(np.concatenate([[0.0], moves])):
        uncovered = moves > atol
        if (uncovered & (size == 0)).any():
            continue
        rtol = float(((moves[uncovered] - atol) / size[uncovered]).max()) if uncovered.any() else 0.0
        best = min(best, (atol + rtol * typical, rtol, float(atol)))
    _, rtol, atol = best
    return {"rtol": _up(max(rtol, rtol_floor)), "atol": _up(max(atol, atol_floor)),
            "moved": _up(float(moves.max() / SAFETY))}


def _continuous(name: str, base: np.ndarray, moves: np.ndarray, group: tuple[str, np.ndarray] | None,
                mode: str | None, amplitude: float, runs: int) -> dict[str, Any]:
    atol_floor = C_ATOL[mode] if mode and name in C_COLUMNS else 0.0
    floor = f"floor: c within {atol_floor:g} ({mode} spectrum)" if atol_floor else f"floor rtol {FLOAT32_RTOL:g}"
    spec: dict[str, Any] = {"rule": "continuous"}
    if group is None:
        spec.update(_fit(base, moves, FLOAT32_RTOL, atol_floor))
        unmoved = spec["moved"] == 0
    else:
        spec["by"], groups = group
        spec["groups"] = {str(label): _fit(base[groups == label], moves[groups == label], FLOAT32_RTOL, atol_floor)
                          for label in dict.fromkeys(groups)}
        unmoved = all(group["moved"] == 0 for group in spec["groups"].values())
    if unmoved:
        spec["reason"] = (f"never moved in {runs} perturbed runs: a count or a formula of the settings; "
                          f"rtol {FORMULA_RTOL:g} for another libm's last bit")
    else:
        spec["reason"] = (f"{SAFETY:g} × its largest move in {runs} runs perturbed by {amplitude:.2g} relative"
                          f"{' (per ' + group[0] + ')' if group is not None else ''}; {floor}")
    return spec


def _cells(base: np.ndarray, moves: np.ndarray, runs: int, what: str = "threshold count, histogram bin or rank"
           ) -> dict[str, Any]:
    moved = {str(i): _up(SAFETY * float(move)) if np.isfinite(move) else None
             for i, move in enumerate(moves.reshape(-1)) if move > 0}
    free = "; null: a NaN came or went, any value" if any(value is None for value in moved.values()) else ""
    return {"rule": "cells", "rtol": FORMULA_RTOL, "cells": moved,
            "reason": (f"discrete ({what}): the {len(moved)} cells that moved in {runs} perturbed runs may move "
                       f"{SAFETY:g}× as far (atol per cell{free}), "
                       f"the others agree to {FORMULA_RTOL:g}")}


def _flips(changed: np.ndarray, runs: int) -> dict[str, Any]:
    cells = [int(i) for i in np.flatnonzero(changed.reshape(-1))]
    return {"rule": "flips", "cells": cells,
            "reason": (f"text the perturbations change (a greedy answer): the {len(cells)} cells that changed in "
                       f"{runs} perturbed runs may hold another text, the others are equal")}


def _discrete(name: str, column: str) -> bool:
    task = name.split("/")[-1].startswith("task_")
    return column in DISCRETE or column in STEPS or (task and column in TASK_DISCRETE)


def _group(table: Table) -> tuple[str, np.ndarray] | None:
    """(column, labels) of the first of GROUPS the table has: its labels get tolerances of their own."""
    column = next((column for column in GROUPS if column in table and table[column].ndim == 1), None)
    return None if column is None else (column, table[column].astype(str))


def _mode(files: Mapping[str, bytes]) -> str | None:
    """The spectrum mode of an analyze run ("exact"), None for other kinds."""
    if "run.json" not in files:
        return None
    meta = json.loads(files["run.json"])
    return meta.get("settings", {}).get("extra", {}).get("spectrum") or meta.get("spectrum")


def derive(files: Mapping[str, bytes], perturbed: Sequence[Mapping[str, bytes]], amplitude: float) -> dict[str, Any]:
    """One case's tolerances.json from its outputs and the same case's outputs on perturbed inputs."""
    tables, others = _tables(files), [_tables(run) for run in perturbed]
    mode = _mode(files)
    spec: dict[str, Any] = {
        "derived": (f"{len(perturbed)} runs with every weight (and synthetic q, k, v) multiplied by 1 + u·{amplitude:.3g}, "
                    f"u ~ U(-1, 1) seeded; see tests/tolerances.py"),
        "files": {},
    }
    for name in files:
        if name not in tables:
            if any(run[name] != files[name] for run in perturbed):
                raise ValueError(f"{name} moved under the perturbations, and a file that is not a table has no rule "
                                 "but exact: give it one in tests/tolerances.py")
            spec["files"][name] = {"rule": "exact", "reason": "settings and labels: no rounding enters"}
            continue
        table = tables[name]
        rows_rule, aligned = rows.derive(name, table, [other[name] for other in others])
        group = _group(table) if name.endswith(".csv") else None
        changed = {column: _changed(base, [other[column] for other in aligned], f"{name}:{column}")
                   for column, base in table.items() if not _is_float(base)}
        labels = [column for column, moved in changed.items() if not moved.any()]
        columns: dict[str, Any] = {}
        if labels:
            columns[", ".join(labels)] = {"rule": "exact", "reason": "labels, indices and counts"}
        for column, base in table.items():
            where, theirs = f"{name}:{column}", [other[column] for other in aligned]
            if not _is_float(base):
                if column in labels:
                    continue
                if base.dtype.kind in "iub":
                    moves = _moves(base.astype(float), [other.astype(float) for other in theirs], where)
                    columns[column] = _cells(base, moves, len(perturbed), "an integer the perturbations move")
                else:
                    columns[column] = _flips(changed[column], len(perturbed))
            elif _discrete(name, column):
                columns[column] = _cells(base, _moves(base, theirs, where, discrete=True), len(perturbed),
                                         *([] if column in DISCRETE else [STEPS.get(column, TASK_STEPS)]))
            else:
                columns[column] = _continuous(column, base, _moves(base, theirs, where), group, mode, amplitude,
                                              len(perturbed))
        spec["files"][name] = {"columns": columns} if rows_rule is None else {"rows": rows_rule, "columns": columns}
    return spec


def _scaled(want: np.ndarray, tol: Mapping[str, Any]) -> float:
    """The atol of a continuous tolerance `tol` on a column `want` (all its groups): for one the perturbations never
    moved (rtol 1e-12, a formula of the settings), at least rtol of the column's largest finite magnitude — a value
    zero in theory (an exponent fitted on a constant, ~1e-16) rounds at its column's scale, not its own."""
    finite = np.abs(want[np.isfinite(want)])
    if tol.get("moved", 1.0) != 0.0 or not finite.size:
        return tol["atol"]
    return max(tol["atol"], tol["rtol"] * float(finite.max()))


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float | np.ndarray) -> np.ndarray:
    """Which cells of `got` are within atol + rtol·|want| of `want` (NaN matches NaN, ±inf itself)."""
    with np.errstate(invalid="ignore"):
        near = np.abs(got - want) <= atol + rtol * np.abs(want)
    return near | (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))


def _where(name: str, column: str, index: np.ndarray, labels: Table | None) -> str:
    """A readable list of the first failing cells: their row labels where the table has them."""
    shown = []
    for i in index[:3]:
        if labels is not None and len(labels):
            first = next(iter(labels.values()))
            if first.ndim == 1 and i < len(first):
                shown.append(" ".join(f"{key}={values[i]}" for key, values in labels.items()))
                continue
        shown.append(str(i))
    return f"{name}:{column} at {'; '.join(shown)}{' …' if len(index) > 3 else ''}"


def _check_column(name: str, column: str, got: np.ndarray, want: np.ndarray, rule: Mapping[str, Any],
                  table: Table, labels: Table | None, compared: np.ndarray) -> list[str]:
    """`got` against `want` by `rule`, on the rows `compared` (all but a rows rule's optional rows that `got`
    lacks)."""
    if got.shape != want.shape:
        return [f"{name}:{column} has shape {got.shape}, the baseline {want.shape}"]
    kind = rule["rule"]
    if kind == "exact" or (not _is_float(want) and kind not in ("cells", "flips")):
        same = bool((_equal(got, want) | ~compared.reshape(-1, *[1] * (want.ndim - 1))).all())
        return [] if same else [f"{name}:{column} differs (compared exactly: {rule.get('reason', 'a label')})"]
    if kind == "flips":
        ok = _equal(got, want).reshape(-1)
        ok[[int(cell) for cell in rule["cells"]]] = True
        ok = ok.reshape(want.shape)
    elif kind == "cells":
        got, want = got.astype(float), want.astype(float)
        atol = np.zeros(want.size)
        for cell, value in rule["cells"].items():
            atol[int(cell)] = np.inf if value is None else value
        ok = _close(got.reshape(-1), want.reshape(-1), rule["rtol"], atol) | np.isinf(atol)
        ok = ok.reshape(want.shape)
    elif "groups" in rule:
        got, want = got.astype(float), want.astype(float)
        if rule["by"] not in table:
            return [f"{name}:{column}: tolerances per {rule['by']} but the table has no such column"]
        groups = table[rule["by"]].astype(str)
        ok = np.zeros(want.shape, dtype=bool)
        for label, tol in rule["groups"].items():
            rows = groups == label
            ok[rows] = _close(got[rows], want[rows], tol["rtol"], _scaled(want, tol))
        unknown = ~np.isin(groups, list(rule["groups"]))
        ok[unknown] = False
    else:
        got, want = got.astype(float), want.astype(float)
        ok = _close(got, want, rule["rtol"], _scaled(want, rule))
    ok |= ~compared.reshape(-1, *[1] * (want.ndim - 1))
    bad = np.flatnonzero(~ok.reshape(-1))
    if not len(bad):
        return []
    if kind == "flips":
        return [f"{_where(name, column, bad, labels)}: {len(bad)} cells differ where the perturbations changed none"]
    moves = np.abs(got.reshape(-1)[bad] - want.reshape(-1)[bad])
    worst = f"{np.nanmax(moves):.3g}" if np.isfinite(moves).any() else "NaN: a NaN came or went"
    return [f"{_where(name, column, bad, labels)}: {len(bad)} cells beyond the tolerance (largest |Δ| {worst})"]


def check(got: Mapping[str, bytes], want: Mapping[str, bytes], spec: Mapping[str, Any]) -> list[str]:
    """Every way `got` departs from the baseline `want` beyond `spec` (a tolerances.json); empty when it agrees."""
    problems = []
    if sorted(got) != sorted(want):
        return [f"files differ: {sorted(got)} against the baseline's {sorted(want)}"]
    if sorted(spec["files"]) != sorted(want):
        return [f"{FILE} covers {sorted(spec['files'])}, the baseline has {sorted(want)}: regenerate it"]
    got_tables, want_tables = _tables(got), _tables(want)
    for name in sorted(want):
        rules = spec["files"][name]
        if name not in want_tables:
            if got[name] != want[name]:
                problems.append(f"{name} differs ({rules['reason']})")
            continue
        a, b = got_tables[name], want_tables[name]
        if list(a) != list(b):
            problems.append(f"{name}: columns or arrays {list(a)} against the baseline's {list(b)}")
            continue
        covered = {column: rule for key, rule in rules["columns"].items() for column in key.split(", ")}
        if sorted(covered) != sorted(b):
            problems.append(f"{name}: {FILE} covers {sorted(covered)}, not {sorted(b)}: regenerate it")
            continue
        labels = {key: values for key, values in b.items() if not _is_float(values) and values.ndim == 1} \
            if name.endswith(".csv") else None
        compared = np.ones(len(next(iter(b.values()))) if b and name.endswith(".csv") else 1, dtype=bool)
        if "rows" in rules:
            found, a, compared = rows.check(name, a, b, rules["rows"])
            problems += found
            if found:
                continue
        for column in b:
            problems += _check_column(name, column, a[column], b[column], covered[column], b, labels,
                                      compared if name.endswith(".csv") else np.ones(1, dtype=bool))
    return problems
