"""What the renderers of readme_numbers.py share: how a value is written (significant figures, ranges; two decimals,
intervals, lists and tables as the report pages write them, `spectra.report.markdown`) and how a run is read (a command's run, a setting, an approx run's errors per budget, a scaling run's
exponents, a decoder's sink mass per layer)."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import pandas as pd

from spectra.report.markdown import interval, listed, table, two  # noqa: F401  (the renderers write as the pages do)
from spectra.report.summaries import approx_by_budget

#: a renderer's input: command (analyze, approx, …) → its runs, in the order of the code block
Runs = dict[str, list[Any]]


class RenderError(Exception):
    """A paragraph's runs do not hold what its renderer reads (a missing command, table or setting)."""


# ---------------------------------------------------------------- formatting


def sig(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant figures, never in scientific notation (70.0, 137, 3670, 0.0041)."""
    if not math.isfinite(value) or value == 0:
        return f"{value:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{value:.{decimals}f}" if decimals >= 0 else f"{round(value, decimals):.0f}"


def sig2(value: float) -> str:
    return sig(value, 2)


def span(values: Sequence[float], format: Callable[[float], str]) -> str:
    """'low–high' of some values, or the one value when both ends read the same."""
    low, high = format(min(values)), format(max(values))
    return low if low == high else f"{low}–{high}"


def slashed(values: Sequence[float], format: Callable[[float], str] = str) -> str:
    return " / ".join(format(value) for value in values)


def percent(value: float) -> str:
    return f"{value:.0f}"


def count(number: int, noun: str) -> str:
    """'one sequence', '4 sequences'."""
    return f"one {noun}" if number == 1 else f"{number} {noun}s"


# ---------------------------------------------------------------- reading runs


def only(runs: Runs, command: str, index: int = 0) -> Any:
    found = runs.get(command, [])
    if len(found) <= index:
        raise RenderError(f"the code block has no `spectra {command}` command #{index + 1}")
    return found[index]


def extra(run: Any, name: str) -> Any:
    """An analysis setting as run.json records it (settings.extra, then the top level)."""
    settings = run.meta.get("settings", {}).get("extra", {})
    return settings[name] if name in settings else run.meta[name]


def evaluated(run: Any) -> int:
    """The sequences an approx run measured: with fitted methods, those after the calibration sequences."""
    return int(run.meta["samples"])  # run.json's samples counts the evaluated sequences (issue 30)


def fitting(run: Any) -> dict[str, str]:
    """The calibration of an approx run with fitted methods: its sequences, the held-out ones, the Adam steps."""
    return {"n": str(run.meta["n"]), "fit_samples": str(extra(run, "fit_samples")), "held_out": str(evaluated(run)),
            "fit_steps": str(extra(run, "fit_steps"))}


def by_budget(run: Any, method: str, table: str = "head_stats") -> pd.Series:
    """Mean over layers of the per-layer mean head-output error of `method`, per budget."""
    rows = approx_by_budget(run) if table == "head_stats" else \
        run.per_layer("out_err", table=table).groupby(["method", "budget"], sort=False)["out_err"].mean().reset_index()
    found = rows[rows["method"] == method].set_index("budget")["out_err"].sort_index()
    if found.empty:
        raise RenderError(f"{run.path} has no method {method}")
    return found


def end_to_end(run: Any, method: str, budget: int, allocation: str = "uniform") -> pd.Series:
    frame = run.end_to_end
    if "allocation" in frame.columns:
        frame = frame[frame["allocation"] == allocation]
    rows = frame[(frame["method"] == method) & (frame["budget"] == budget)]
    if rows.empty:
        raise RenderError(f"{run.path} has no end-to-end row for {method} at k = {budget} ({allocation})")
    return rows.iloc[0]


def pooled(run: Any, metric: str = "rank90") -> pd.Series:
    rows = run.exponents[(run.exponents["scope"] == "pooled") & (run.exponents["metric"] == metric)]
    return rows.iloc[0]


def layer_alphas(run: Any, metric: str = "rank90") -> list[float]:
    rows = run.exponents[(run.exponents["scope"] == "layer") & (run.exponents["metric"] == metric)]
    return list(rows.sort_values("layer")["alpha"])


def in_proportion(run: Any) -> bool:
    """Whether the pooled exponent of rank90 says the needed k grows in proportion to n (α's interval ≥ 0.9)."""
    return bool(pooled(run)["alpha_low"] >= 0.9)


def sink_layers(run: Any) -> dict[str, str]:
    """Sink mass per layer (mean over heads): its range and how many layers of each half exceed 0.5."""
    sink = run.metrics.groupby("layer")["sink_mean"].mean()
    half = run.layers // 2
    return {"sink_min": sig2(sink.min()), "sink_min_layer": str(sink.idxmin()), "sink_max": sig2(sink.max()),
            "sink_max_layer": str(sink.idxmax()), "sink_late": str(int((sink.iloc[half:] > 0.5).sum())),
            "late_layers": str(run.layers - half), "sink_early": str(int((sink.iloc[:half] > 0.5).sum())),
            "early_layers": str(half)}
