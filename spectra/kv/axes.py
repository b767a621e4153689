"""Which axis of a KV cache a head can lose at a byte budget: tokens, key channels, rank or bits (issue 32, item 4).

A press removes one axis of the cache (`presses.base.Press.axis`): tokens (eviction: snapkv, knorm, …; Linformer's
rows along the sequence), key channels (ThinK), rank (lowrank's principal directions) or bits (KIVI). `spectra
cache` measures, per (press, ratio) and query head, the relative error of the head's attention output over the
continuation's queries against the full cache, with the layer's exact inputs (`continuation.head_measures`:
‖o − o_full‖_F / ‖o_full‖_F), and the bytes its key/value head's context cache stores (`Compressed.memory`, as a
share of the full cache's). With exact inputs a head's error depends on its own key/value head's cache only, so the
heads of one run are as many independent experiments.

`best_axes` reads those per-head rows at each byte budget b (a share of the full cache's bytes): per layer and
key/value head, for each axis the lowest error among the axis' measured (press, ratio) whose cache of that key/value
head fits in b (the error of a key/value head: the mean over its query heads), and which axis loses least. An axis
none of whose measurements fits (ThinK below half the bytes: it keeps every value) is left out at that budget.
Matched bytes are as fine as the run's ratios: each row says the bytes it used. `join_diagnosis` puts the head's
diagnosis from `spectra heads` beside it, per key/value head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

#: what a press can remove from a cache (`Press.axis`), in the order tables and figures list them, and what a ratio
#: counts along each: a press's ratio is the share of its axis' units removed unless the press says otherwise
UNITS = {"tokens": "cached tokens", "channels": "key channels", "rank": "principal directions", "bits": "bits"}
AXES = tuple(UNITS)
#: cache_axes.csv's columns
COLUMNS = ("budget", "layer", "kv_head", "axis", "press", "ratio", "bytes_share", "out_err", "best")
#: the diagnosis scores joined per key/value head: the largest of its query heads' (DuoAttention's convention for
#: retrieval), and the mean of the others'
JOINED_MAX, JOINED_MEAN = ("retrieval",), ("sink_share", "local", "induction_score", "entropy", "rank90")
#: slack on "fits in the budget": the shares are ratios of integers, the budgets typed decimals
SLACK = 1e-9


def ratio_meaning(facts: Mapping[str, object]) -> str:
    """What a press's ratio is, from its declared facts (torch-free): its `ratio_means`, else the share of its
    `axis`' units removed."""
    return str(facts.get("ratio_means") or f"the share of {UNITS[str(facts.get('axis', 'tokens'))]} removed")


def kv_head_errors(head_stats: pd.DataFrame, axes_of: Mapping[str, str], kv_heads: int) -> pd.DataFrame:
    """Per (press, ratio, layer, key/value head): its axis, bytes share and output error (the mean over its query
    heads) from cache_heads.csv's per-query-head rows; the full cache left out."""
    table = head_stats[head_stats["press"] != "full"]
    heads = int(table["head"].max()) + 1
    table = table.assign(kv_head=table["head"].to_numpy(int) // (heads // kv_heads),
                         axis=table["press"].map(dict(axes_of)))
    grouped = table.groupby(["press", "ratio", "layer", "kv_head", "axis"], sort=False)
    return grouped.agg(bytes_share=("bytes_share", "mean"), out_err=("out_err", "mean")).reset_index()


def best_axes(head_stats: pd.DataFrame, axes_of: Mapping[str, str], kv_heads: int,
              budgets: Sequence[float]) -> pd.DataFrame:
    """cache_axes.csv (`COLUMNS`): per budget, layer, key/value head and axis, the axis' least-losing (press, ratio)
    within the budget, and `best` on the axis whose error is lowest (ties to the earlier axis of AXES)."""
    import pandas as pd

    errors = kv_head_errors(head_stats, axes_of, kv_heads)
    errors = errors.assign(order=errors["axis"].map({axis: i for i, axis in enumerate(AXES)}))
    rows = []
    for budget in budgets:
        fits = errors[errors["bytes_share"] <= budget + SLACK]
        chosen = fits.sort_values(["out_err", "bytes_share", "order"], kind="stable")
        chosen = chosen.groupby(["layer", "kv_head", "axis"], sort=False).head(1)
        chosen = chosen.sort_values(["layer", "kv_head", "order"], kind="stable")
        best = chosen.sort_values(["out_err", "order"], kind="stable").groupby(["layer", "kv_head"]).head(1).index
        rows.append(chosen.assign(budget=float(budget), best=chosen.index.isin(best)))
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS))
    found = pd.concat(rows, ignore_index=True)
    found["layer"], found["kv_head"] = found["layer"].astype(int), found["kv_head"].astype(int)
    return found[list(COLUMNS)]


def join_diagnosis(axes: pd.DataFrame, diagnosis: pd.DataFrame) -> pd.DataFrame:
    """`axes` with each key/value head's diagnosis from a `spectra heads` run (diagnosis.csv: one row per layer and
    query head, with its kv_head): `head_types` (its query heads' types in head order, joined by '+'), the largest
    retrieval score of its query heads, and the mean of the other JOINED_MEAN scores."""
    grouped = diagnosis.sort_values(["layer", "head"]).groupby(["layer", "kv_head"], sort=True)
    per_kv = grouped.agg(head_types=("head_type", "+".join),
                         **{name: (name, "max") for name in JOINED_MAX if name in diagnosis},
                         **{name: (name, "mean") for name in JOINED_MEAN if name in diagnosis}).reset_index()
    return axes.merge(per_kv, on=["layer", "kv_head"], how="left")


def dominant_type(head_types: pd.Series) -> pd.Series:
    """Each key/value head's most common query-head type from join_diagnosis' `head_types` ('sink+sink+mixed' →
    'sink'; a tie goes to the type first by name), so a key/value head has one type to count maps by."""
    return head_types.str.split("+").map(lambda types: max(sorted(set(types)), key=types.count))


def summary(axes: pd.DataFrame) -> pd.DataFrame:
    """Per budget and axis: how many key/value heads it is best for, and its median error and bytes share over all
    heads where it fits."""
    import pandas as pd

    rows = []
    for (budget, axis), group in axes.groupby(["budget", "axis"], sort=False):
        rows.append({"budget": budget, "axis": axis, "best_heads": int(group["best"].sum()), "heads": len(group),
                     "median_err": float(np.median(group["out_err"])),
                     "median_bytes_share": float(np.median(group["bytes_share"]))})
    order = {axis: i for i, axis in enumerate(AXES)}
    table = pd.DataFrame(rows, columns=["budget", "axis", "best_heads", "heads", "median_err", "median_bytes_share"])
    return table.sort_values(["budget", "axis"], key=lambda column: column.map(order) if column.name == "axis"
                             else column, kind="stable").reset_index(drop=True)


#: the file of a cache run holding the axis map, and the columns a plan reads of it
MAP_FILE, PLAN_COLUMNS = "cache_axes.csv", ("budget", "layer", "kv_head", "press", "ratio", "best")


def read_plan(run: str) -> pd.DataFrame:
    """The mixed plan in a cache run directory `run` (or its cache_axes.csv itself): per budget, layer and key/value
    head the (press, ratio) of its best axis. A missing or damaged map, or one naming a press that reads a prefill
    pass (`kv.passes`, which the engine computes only when a listed press declares it), is one line (SpectraError)."""
    from pathlib import Path

    import pandas as pd

    from ..errors import SpectraError
    from ..registry import PRESSES

    path = Path(run)
    path = path / MAP_FILE if path.is_dir() else path
    if not path.exists():
        raise SpectraError(f"mixed({run}) reads the axis map {path}, which does not exist: give a spectra cache run "
                           f"made with --bytes-kept (its {MAP_FILE})")
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise SpectraError(f"mixed({run}) reads the axis map {path}, written by spectra cache --bytes-kept: "
                           f"{error}") from None
    missing = [column for column in PLAN_COLUMNS if column not in table.columns]
    if missing:
        raise SpectraError(f"{path} is no axis map of spectra cache --bytes-kept: no column {', '.join(missing)}")
    plan = table[table["best"].astype(bool)][list(PLAN_COLUMNS[:-1])].reset_index(drop=True)
    unknown = sorted(set(plan["press"]) - set(PRESSES.names()))
    reading = sorted(press for press in set(plan["press"]) - set(unknown) if PRESSES.facts(press).get("reads"))
    if unknown or reading:
        what = "unknown presses" if unknown else "presses reading a prefill pass (spectra/kv/passes.py), which it " \
                                                 "does not prefill"
        raise SpectraError(f"the axis map {path} names {what}: {', '.join(unknown or reading)}")
    if plan.empty:
        raise SpectraError(f"the axis map {path} holds no best axis")
    return plan


def check_plan(run: str) -> None:
    """The registry's check of `mixed(RUN)`'s argument before anything loads: RUN holds a readable axis map."""
    read_plan(run)


#: how close a ratio's budget 1 − r must be to one of an axis map's budgets
TOLERANCE = 1e-6


def plan_budget(budgets: Sequence[float], ratio: float) -> float | None:
    """The budget of an axis map that the ratio r plays (the one within `TOLERANCE` of 1 − r), or None."""
    nearest = min(budgets, key=lambda budget: abs(budget - (1 - ratio)), default=None)
    return nearest if nearest is not None and abs(nearest - (1 - ratio)) <= TOLERANCE else None


def check_plan_ratios(run: str, ratios: Sequence[float]) -> None:
    """Refuse, before anything loads, ratios whose budget 1 − r the axis map of `mixed(run)` does not hold (it
    plans heads at its own budgets only), naming the ratios it can play and how to map another budget."""
    from ..errors import SpectraError, spell

    budgets = sorted({float(budget) for budget in read_plan(run)["budget"]})
    lacking = [ratio for ratio in ratios if plan_budget(budgets, ratio) is None]
    if not lacking:
        return
    playable = ",".join(f"{1 - budget:g}" for budget in reversed(budgets) if budget < 1)
    asked = ",".join(f"{1 - ratio:g}" for ratio in lacking)
    ratios_given = ",".join(f"{ratio:g}" for ratio in lacking)
    raise SpectraError(f"mixed({run}) plays the byte budgets of its axis map, {', '.join(f'{b:g}' for b in budgets)} "
                       f"(ratios {playable or 'none above 0'}), but {spell(f'--ratios {ratios_given}', f'ratios={ratios_given}')} "
                       f"asks for {asked}: pass ratios among {playable or 'its'}, or map {asked} first with "
                       f"{spell(f'--bytes-kept {asked}', f'bytes_kept={asked!r}')}")
