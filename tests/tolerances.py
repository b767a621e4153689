"""How far a stored regression output may move on another machine: derived from perturbed runs, then checked.

`derive(files, perturbed, amplitude)` turns one case's outputs and the same case run on perturbed inputs
(regression.py: every weight of the tiny model and every synthetic q, k, v multiplied by 1 + u·2⁻²³,
u ~ U(−1, 1) seeded — a rounding-level change like another machine's kernels make) into the case's
tolerances.json; `check(got, want, spec)` compares outputs with a stored baseline through it. Δ_i is the
largest move of cell i over the perturbed runs; the rules:

- **exact**: run.json (scrubbed of timings and versions), every non-float column (labels such as method,
  layer, head; counts such as `samples`), integer arrays, and the columns, rows and their order.
- **continuous** float columns and arrays: |got − want| ≤ atol + rtol·|want| (NaN only where NaN), with
  SAFETY·Δ_i ≤ atol + rtol·|x_i| on every cell — per column, and per method where the table has one, so
  a method that amplifies rounding by its own conditioning (skyformer's near-zero normaliser, nystrom's
  ill-conditioned A, svd at a rank where σ_k ≈ σ_k+1) does not loosen the others. Of the pairs that cover
  every cell the one tightest at the column's median magnitude is kept: relative for most columns, absolute
  for differences near zero (ppl_change, mean_low), whose error is that of the numbers they subtract.
  Floors, what the computation guarantees anyway: rtol ≥ 1e-6 (float32 forward passes, ~1e-7 per
  operation), c within 2e-6 (each machine within 1e-6 of a float64 SVD of its P), and rtol 1e-12 for a
  column the perturbations never move (a count or a formula of the settings: another libm may still round
  its last bit).
- **cells** for the discrete columns — success rates (`pr*`: Pr(err ≤ ε) and its interval), histogram
  quantiles (`median`, `p95`: bin edges of a 100-per-decade histogram, or the clipped min/max) and the rank
  counts' moments (`rank90_*`, `rank99_*`) — which move only where a sample sits within rounding of a
  threshold or a bin edge, and then by a whole step. The perturbed runs find those cells: they move the
  outputs about as far as another machine does or further (the old baseline, written on another CPU,
  differs from this machine's outputs by a median 0.25 of the largest perturbed move per column, at most
  1.3×), so a sample within another machine's rounding of a threshold flips in a good share of the 16
  runs, and all of them missing it is unlikely. A cell that moved may move SAFETY times as far as it did
  (its own absolute tolerance); a cell that never moved must agree to 1e-12.

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
GROUP = "method"

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


def _moves(base: np.ndarray, perturbed: Sequence[np.ndarray], where: str) -> np.ndarray:
    """Largest |x' − x| per cell over the perturbed runs (0 where both are the same NaN or infinity)."""
    moves = np.zeros(base.shape)
    for other in perturbed:
        if other.shape != base.shape or not np.array_equal(np.isnan(other), np.isnan(base)) \
                or not np.array_equal(other[np.isinf(other)], base[np.isinf(base)]):
            raise ValueError(f"{where}: a perturbed run changed the shape, the NaN or the infinite cells")
        finite = np.isfinite(base)
        moves[finite] = np.maximum(moves[finite], np.abs(other[finite] - base[finite]))
    return moves


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


def _continuous(name: str, base: np.ndarray, moves: np.ndarray, groups: np.ndarray | None, mode: str | None,
                amplitude: float, runs: int) -> dict[str, Any]:
    atol_floor = C_ATOL[mode] if mode and name in C_COLUMNS else 0.0
    floor = f"floor: c within {atol_floor:g} ({mode} spectrum)" if atol_floor else f"floor rtol {FLOAT32_RTOL:g}"
    spec: dict[str, Any] = {"rule": "continuous"}
    if groups is None:
        spec.update(_fit(base, moves, FLOAT32_RTOL, atol_floor))
        unmoved = spec["moved"] == 0
    else:
        spec["by"] = GROUP
        spec["groups"] = {str(label): _fit(base[groups == label], moves[groups == label], FLOAT32_RTOL, atol_floor)
                          for label in dict.fromkeys(groups)}
        unmoved = all(group["moved"] == 0 for group in spec["groups"].values())
    if unmoved:
        spec["reason"] = (f"never moved in {runs} perturbed runs: a count or a formula of the settings; "
                          f"rtol {FORMULA_RTOL:g} for another libm's last bit")
    else:
        spec["reason"] = (f"{SAFETY:g} × its largest move in {runs} runs perturbed by {amplitude:.2g} relative"
                          f"{' (per ' + GROUP + ')' if groups is not None else ''}; {floor}")
    return spec


def _cells(base: np.ndarray, moves: np.ndarray, runs: int) -> dict[str, Any]:
    moved = {str(i): _up(SAFETY * float(move)) for i, move in enumerate(moves.reshape(-1)) if move > 0}
    return {"rule": "cells", "rtol": FORMULA_RTOL, "cells": moved,
            "reason": (f"discrete (threshold count, histogram bin or rank): the {len(moved)} cells that moved in {runs} "
                       f"perturbed runs may move {SAFETY:g}× as far (atol per cell), the others agree to "
                       f"{FORMULA_RTOL:g}")}


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
            spec["files"][name] = {"rule": "exact", "reason": "settings and labels: no rounding enters"}
            continue
        table = tables[name]
        groups = table[GROUP].astype(str) if GROUP in table else None
        labels = [column for column, base in table.items() if not _is_float(base)]
        columns: dict[str, Any] = {}
        if labels:
            columns[", ".join(labels)] = {"rule": "exact", "reason": "labels, indices and counts"}
        for column, base in table.items():
            if not _is_float(base):
                continue
            moves = _moves(base, [other[name][column] for other in others], f"{name}:{column}")
            if column in DISCRETE:
                columns[column] = _cells(base, moves, len(perturbed))
            else:
                columns[column] = _continuous(column, base, moves, groups, mode, amplitude, len(perturbed))
        spec["files"][name] = {"columns": columns}
    return spec


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
                  groups: np.ndarray | None, labels: Table | None) -> list[str]:
    if got.shape != want.shape:
        return [f"{name}:{column} has shape {got.shape}, the baseline {want.shape}"]
    kind = rule["rule"]
    if kind == "exact" or not _is_float(want):
        same = np.array_equal(got, want) if not _is_float(want) else np.array_equal(got, want, equal_nan=True)
        return [] if same else [f"{name}:{column} differs (compared exactly: {rule.get('reason', 'a label')})"]
    got, want = got.astype(float), want.astype(float)
    if kind == "cells":
        atol = np.zeros(want.size)
        for cell, value in rule["cells"].items():
            atol[int(cell)] = value
        ok = _close(got.reshape(-1), want.reshape(-1), rule["rtol"], atol).reshape(want.shape)
    elif "groups" in rule:
        if groups is None:
            return [f"{name}:{column}: tolerances per {rule['by']} but the table has no such column"]
        ok = np.zeros(want.shape, dtype=bool)
        for label, tol in rule["groups"].items():
            rows = groups == label
            ok[rows] = _close(got[rows], want[rows], tol["rtol"], tol["atol"])
        unknown = ~np.isin(groups, list(rule["groups"]))
        ok[unknown] = False
    else:
        ok = _close(got, want, rule["rtol"], rule["atol"])
    bad = np.flatnonzero(~ok.reshape(-1))
    if not len(bad):
        return []
    worst = np.nanmax(np.abs(got.reshape(-1)[bad] - want.reshape(-1)[bad]))
    return [f"{_where(name, column, bad, labels)}: {len(bad)} cells beyond the tolerance (largest |Δ| {worst:.3g})"]


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
        groups = b[GROUP].astype(str) if GROUP in b else None
        for column in b:
            problems += _check_column(name, column, a[column], b[column], covered[column], groups, labels)
    return problems
