"""Per-layer (and per-head) compression ratios at equal total cache: uniform, PyramidKV's schedule, and schedules
guided by spectra's measurements — the list kvpress's `PerLayerCompressionPress(press, compression_ratios)` takes.

A schedule maps a mean ratio r and a context length L to one ratio per layer. Each ratio is made for a whole number
of kept tokens n_ℓ and gives exactly that count through kvpress's own n_kept = int(L·(1 − r_ℓ)) (`ratio_keeping`:
1 − n/L itself can lose a token to the truncation), and the counts add up to those of the uniform ratio:

- `uniform`: r everywhere;
- `pyramid`: kvpress 0.5.5's PyramidKVPress budget (window 64, β = 20: a linear ramp from the first layer to the
  last, with kvpress's fallback to a flat round(L(1 − r)) when the ramp does not fit);
- `spectral`: kept tokens proportional to a per-layer weight measured by `spectra analyze` (`measures`): the
  centred key rank (`pca_rank90`: a layer whose keys spread over more directions is taken to need more of them),
  the attention's effective number of keys exp(entropy) (a layer attending broadly needs more), or the share of
  attention not on the first token, 1 − sink mass (a layer that parks its attention on the sink needs less). Shares
  above the whole context are capped at it and the surplus handed to the other layers in proportion (water-filling),
  so the total is kept exactly: the shares become whole tokens by largest remainders, adding up to N_layers·int(L·(1 − r)).

`Scheduled` runs any eviction press with a schedule: at layer ℓ it compresses at the schedule's ratio for ℓ instead
of the nominal one. `export` writes a schedule as kvpress's JSON list.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .base import Compressed, Prefill, Press, full

#: PyramidKV's defaults in kvpress 0.5.5
PYRAMID_WINDOW, PYRAMID_BETA = 64, 20
#: the measurements a spectral schedule can follow: column of which table, and how it becomes a weight
MEASURES = {"key_rank": ("qkv", "pca_rank90"), "entropy": ("metrics", "entropy_mean"),
            "sink": ("metrics", "sink_mean")}

#: (mean ratio, context length) → one ratio per layer
Schedule = Callable[[float, int], list[float]]


def pyramid_kept(length: int, ratio: float, layers: int, window: int = PYRAMID_WINDOW,
                 beta: int = PYRAMID_BETA) -> list[int]:
    """Tokens kept per layer by kvpress 0.5.5's PyramidKVPress.get_layer_budget (ratio 0: every token)."""
    if ratio == 0:
        return [length] * layers
    capacity = window + length * (1 - ratio)
    low = (capacity - window) / beta
    high = (capacity - window) * 2 - low
    if high >= length - window:
        high = length - window
        low = (capacity - window) * 2 - high
    if not length >= high >= low >= window:
        return [max(1, round(length * (1 - ratio)))] * layers
    steps = (high - low) / (layers - 1) if layers > 1 else 0.0
    return [round(high - layer * steps) for layer in range(layers)]


def ratio_keeping(kept: int, length: int) -> float:
    """The compression ratio that keeps exactly `kept` of `length` tokens through kvpress's n_kept = int(L·(1 − r)):
    1 − kept/L, moved by the few ulps it takes where float rounding makes L·(1 − r) fall just below `kept` (at L =
    1024, 1 − 103/1024 gives 102.99999999999999, which int() truncates to 102)."""
    if not 1 <= kept <= length:
        raise ValueError(f"cannot keep {kept} of {length} tokens")
    ratio = 1 - kept / length
    while int(length * (1 - ratio)) < kept:
        ratio = math.nextafter(ratio, -math.inf)
    return max(ratio, 0.0)


def pyramid(layers: int) -> Schedule:
    """PyramidKV's per-layer ratios: for each layer the ratio that keeps its budget n_ℓ, ≈ 1 − n_ℓ/L."""
    return lambda ratio, length: [ratio_keeping(kept, length) for kept in pyramid_kept(length, ratio, layers)]


def uniform(layers: int) -> Schedule:
    return lambda ratio, length: [ratio] * layers


def water_fill(weights: Sequence[float], total: float, cap: float = 1.0) -> np.ndarray:
    """Shares s_i ∝ weights with Σ s = total and 0 < s_i ≤ cap: the capped ones at cap, the rest in proportion."""
    weights = np.maximum(np.asarray(weights, dtype=np.float64), 1e-12)
    if total > cap * weights.size * (1 + 1e-12):
        raise ValueError(f"a total share of {total} cannot fit {weights.size} slots of at most {cap}")
    shares = np.zeros_like(weights)
    free = np.ones(weights.size, dtype=bool)
    left = total
    while free.any():
        proposal = left * weights[free] / weights[free].sum()
        over = proposal > cap
        if not over.any():
            shares[free] = proposal
            break
        index = np.flatnonzero(free)[over]
        shares[index], free[index] = cap, False
        left = total - shares[~free].sum()
    return shares


def whole_tokens(shares: np.ndarray, length: int, total: int) -> list[int]:
    """Shares of a context (each in (0, 1]) as whole token counts in [1, length] adding up to `total`: each share's
    floor, then one more token to the largest remainders (a count of 0 raised to 1, taken back from the largest)."""
    exact = np.asarray(shares, dtype=np.float64) * length
    kept = np.clip(np.floor(exact), 1, length).astype(int)
    order = np.argsort(-(exact - np.floor(exact)), kind="stable")
    for index in order[:max(total - int(kept.sum()), 0)]:
        kept[index] = min(kept[index] + 1, length)
    while kept.sum() > total and (kept > 1).any():
        kept[np.argmax(kept)] -= 1
    return [int(count) for count in kept]


def spectral(weights: Sequence[float]) -> Schedule:
    """Per-layer ratios whose kept tokens are proportional to `weights` (one per layer), as whole tokens adding up
    to the uniform ratio's: N_layers·int(L·(1 − r))."""
    weights = list(weights)

    def schedule(ratio: float, length: int) -> list[float]:
        total = len(weights) * max(1, int(length * (1 - ratio)))
        shares = water_fill(weights, total / length)
        return [ratio_keeping(kept, length) for kept in whole_tokens(shares, length, total)]

    return schedule


def layer_weights(measure: str, metrics: pd.DataFrame, qkv: pd.DataFrame | None = None,
                  stage: str = "projection") -> np.ndarray:
    """One weight per layer from an analyze run's metrics.csv / qkv.csv (means over heads; see the module
    docstring): pca_rank90 of the keys at `stage`, exp(entropy), or 1 − sink mass."""
    if measure not in MEASURES:
        raise ValueError(f"unknown measure '{measure}'; choose from {', '.join(MEASURES)}")
    table, column = MEASURES[measure]
    if table == "qkv":
        if qkv is None:
            raise ValueError("the key-rank schedule needs the run's qkv.csv (analyze with --qkv)")
        rows = qkv[(qkv["tensor"] == "k") & (qkv["stage"] == stage)]
        if rows.empty:  # a model without RoPE has the attention stage only
            rows = qkv[qkv["tensor"] == "k"]
        return rows.groupby("layer")[column].mean().sort_index().to_numpy(dtype=np.float64)
    if column not in metrics.columns:
        raise ValueError(f"the run's metrics.csv has no {column} (a run from before sink and entropy were measured)")
    values = metrics.groupby("layer")[column].mean().sort_index().to_numpy(dtype=np.float64)
    return np.exp(values) if measure == "entropy" else 1 - values


def head_weights(measure: str, metrics: pd.DataFrame, qkv: pd.DataFrame | None, kv_heads: int,
                 stage: str = "projection") -> np.ndarray:
    """(layers, kv_heads) weights per key/value head (query-head metrics averaged over each group)."""
    if MEASURES.get(measure, ("", ""))[0] == "qkv" and qkv is not None:
        rows = qkv[(qkv["tensor"] == "k") & (qkv["stage"] == stage)]
        rows = rows if not rows.empty else qkv[qkv["tensor"] == "k"]
        return rows.pivot(index="layer", columns="head", values="pca_rank90").to_numpy(dtype=np.float64)
    layers = [layer_weights(measure, metrics[metrics["head"] == head]) for head in sorted(set(metrics["head"]))]
    per_query_head = np.stack(layers, axis=1)  # (layers, H)
    return per_query_head.reshape(per_query_head.shape[0], kv_heads, -1).mean(-1)


def head_ratios(weights: np.ndarray, ratio: float) -> np.ndarray:
    """Per (layer, key/value head) ratios at mean `ratio`, kept shares ∝ `weights` (water-filled over all heads)."""
    kept = water_fill(weights.ravel(), (1 - ratio) * weights.size)
    return np.clip(1 - kept, 0.0, 1.0).reshape(weights.shape)


def kept_tokens(ratios: Sequence[float], length: int) -> int:
    """Tokens kept over all layers when layer ℓ keeps int(L(1 − r_ℓ)) (kvpress's n_kept)."""
    return sum(max(1, int(length * (1 - ratio))) for ratio in ratios)


def export(ratios: Sequence[float] | np.ndarray, path: str | Path) -> Path:
    """Write `ratios` as the JSON list kvpress's PerLayerCompressionPress(press, compression_ratios=…) takes: one
    ratio per layer. A per-head matrix is refused: PerLayerCompressionPress sets `compression_ratios[layer]` as its
    scorer's `compression_ratio`, so a nested list fails inside kvpress (per-head budgets run as `adakv(<scorer>)`,
    `duo(DIR)` or `headbudget(DIR)` instead)."""
    path = Path(path)
    values = np.asarray(ratios, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"PerLayerCompressionPress takes one ratio per layer; got an array of shape {values.shape} "
                         "(per-head budgets are not a list it accepts)")
    if not np.all(np.isfinite(values)) or values.min() < 0 or values.max() >= 1:
        raise ValueError("compression ratios must lie in [0, 1)")
    path.write_text(json.dumps(values.tolist()) + "\n")
    return path


class Scheduled(Press):
    """`inner` (an eviction press) compressing layer ℓ at `schedule(ratio, L)[ℓ]` instead of the nominal ratio."""

    def __init__(self, name: str, inner: Press, schedule: Schedule, summary: str = "") -> None:
        self.name, self.inner, self.schedule = name, inner, schedule  # type: ignore[misc]
        self.summary = summary or f"{inner.name} with per-layer ratios"  # type: ignore[misc]
        self.axis, self.needs_rope = inner.axis, inner.needs_rope  # type: ignore[misc]

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        layer_ratio = self.schedule(ratio, prefill.length)[prefill.layer]
        if not math.isfinite(layer_ratio) or layer_ratio <= 0:
            return full(prefill)
        return self.inner.compress(prefill, layer_ratio)
