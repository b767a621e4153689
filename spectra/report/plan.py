"""The nonuniform projected dimension: how many rows each layer (or head) may be projected to.

This is the paper's "nonuniform projected dimension" (Linformer, section 4): a layer (or head) whose mean
normalized cumulative singular value reaches the energy E at a small index can be projected to that many
rows, so higher, lower-rank layers get a smaller budget than lower ones. Pure numpy/pandas on an analyze
run's mean curves; `Plan.to_json` is what a Linformer module consumes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import SpectraError, spell
from ..runs import FinishedRun

#: the key a layer's budget had in plans written before the projected dimension was called the budget everywhere
#: (such plans still read)
OLD_KEY = "k_" + "proj"


def check_energy(energy: float) -> float:
    """`energy` as a float if it is a share of the nuclear norm in (0, 1], else a one-line SpectraError."""
    if not (isinstance(energy, (int, float)) and 0 < energy <= 1):
        raise SpectraError(f"{spell('--energy')} must be in (0, 1] (a share of the nuclear norm, e.g. 0.9), got "
                           f"{energy}")
    return float(energy)


def check_multiple(multiple: int) -> int:
    """`multiple` if it is a positive rounding step, else a one-line SpectraError."""
    if multiple < 1:
        raise SpectraError(f"{spell('--multiple')} must be a positive integer (e.g. 8), got {multiple}")
    return int(multiple)


def smallest_index(cum: np.ndarray, energy: float) -> np.ndarray:
    """Smallest 1-based index j with cum[..., j-1] ≥ energy along the last axis (n where none does).

    c_n = 1 by definition, so falling back to n only absorbs round-off when energy is 1.
    """
    reached = np.asarray(cum) >= energy
    return np.where(reached.any(-1), reached.argmax(-1) + 1, reached.shape[-1])


def round_up(index: np.ndarray, multiple: int, n: int) -> np.ndarray:
    """Round up to a multiple of `multiple`, capped at n."""
    return np.minimum(-(-np.asarray(index) // multiple) * multiple, n)


@dataclass
class Plan:
    """The nonuniform projected dimension of every layer (and head) for energy E.

    `table` is tidy: one row per layer, or per (layer, head) when `per_head`, with the exact smallest
    index `k_min`, the rounded `budget` and the mean c reached at `budget`. A layer's budget is the one
    of its head-mean curve, or with `per_head` the largest of its heads' (so every head reaches E).
    """

    n: int
    heads: int
    energy: float
    multiple: int
    per_head: bool
    table: pd.DataFrame
    layer_budget: np.ndarray
    source: str

    @property
    def uniform_budget(self) -> int:
        """The one k a uniform Linformer needs for every layer and head to reach E: the largest budget."""
        return int(self.table["budget"].max())

    def costs(self) -> pd.DataFrame:
        """Attention cost Σ n·budget over every layer and head: this plan, uniform budget and full n·n.

        `plan_share` is the plan's cost over the row's cost; `saved` = 1 − plan_share.
        """
        heads = 1 if self.per_head else self.heads  # without --per-head every head of a layer shares budget
        planned = int(self.n * self.table["budget"].sum() * heads)
        units = int(self.layer_budget.size * self.heads)
        cost = [planned, units * self.n * self.uniform_budget, units * self.n * self.n]
        share = [planned / c for c in cost]
        return pd.DataFrame(
            {
                "attention": ["nonuniform (this plan)", f"uniform budget = {self.uniform_budget}", f"full (budget = n = {self.n})"],
                "cost": cost,
                "plan_share": share,
                "saved": [1 - x for x in share],
            }
        )

    def caption(self) -> str:
        """What the cost table compares, in one sentence."""
        per = "layer and head" if self.per_head else f"layer (× {self.heads} heads sharing its budget)"
        return (
            f"cost = Σ n·budget over every {per}: the multiply-adds of the n × budget scores and of their product "
            f"with the projected values, per unit of head dimension. plan_share = this plan's cost / the row's cost, "
            f"saved = 1 − plan_share, against a uniform Linformer needing budget = {self.uniform_budget} everywhere "
            f"to reach E = {self.energy:g}, and against full attention (n × n, n = {self.n})."
        )

    def by_layer(self) -> pd.DataFrame:
        """One row per layer for printing: its budget, and with `per_head` each head's budget as h0, h1, …"""
        if not self.per_head:
            return self.table
        wide = self.table.pivot(index="layer", columns="head", values="budget")
        wide.columns = [f"h{head}" for head in wide.columns]
        return wide.assign(budget=self.layer_budget).reset_index()[["layer", "budget", *wide.columns]]

    def to_json(self) -> dict[str, Any]:
        """A dict a Linformer module can consume: one budget per layer, optionally one per head."""
        layers = []
        for layer, budget in enumerate(self.layer_budget):
            entry: dict[str, Any] = {"layer": layer, "budget": int(budget)}
            if self.per_head:
                rows = self.table[self.table["layer"] == layer].sort_values("head")
                entry["heads"] = [int(x) for x in rows["budget"]]
            layers.append(entry)
        costs = self.costs().set_index("attention")["cost"]
        return {
            "n": self.n,
            "energy": self.energy,
            "multiple": self.multiple,
            "per_head": self.per_head,
            "criterion": "smallest index whose mean normalized cumulative singular value reaches energy, rounded up "
                         "to a multiple, capped at n" + ("; a layer's budget is the largest of its heads'" if self.per_head
                                                         else "; curve averaged over the layer's heads"),
            "source": self.source,
            "layers": layers,
            "uniform_budget": self.uniform_budget,
            "cost": {"nonuniform": int(costs.iloc[0]), "uniform": int(costs.iloc[1]), "full": int(costs.iloc[2])},
        }


def plan_k(run: FinishedRun, energy: float, *, multiple: int = 8, per_head: bool = False) -> Plan:
    """Smallest budget per layer (or per head) whose mean normalized cumulative singular value reaches `energy`."""
    energy, multiple = check_energy(energy), check_multiple(multiple)
    if per_head:
        curves = np.asarray(run.cum_mean, dtype=float)  # (layers, heads, n)
        layer, head = np.meshgrid(np.arange(run.layers), np.arange(run.heads), indexing="ij")
        ids = {"layer": layer.ravel(), "head": head.ravel()}
    else:
        curves = np.asarray(run.cum_mean, dtype=float).mean(axis=1)  # (layers, n)
        ids = {"layer": np.arange(run.layers)}
    k_min = smallest_index(curves, energy)
    budget = round_up(k_min, multiple, run.n)
    reached = np.take_along_axis(curves, (budget - 1)[..., None], axis=-1)[..., 0]
    table = pd.DataFrame({**ids, "k_min": k_min.ravel(), "budget": budget.ravel(), "c_at_budget": reached.ravel()})
    layer_k = budget.max(axis=1) if per_head else budget
    return Plan(run.n, run.heads, energy, multiple, per_head, table, np.asarray(layer_k), str(run.path))


def read_plan(plan: str | os.PathLike | dict, n: int | None = None) -> tuple[int, ...]:
    """Each layer's budget from a plan written by `spectra plan-k` (its JSON file, or the dict): for a per-head
    plan, the layer's (the largest of its heads'). A plan that records the length n it was made at is refused
    for another `n`: the budget a head needs does not scale in proportion to n (see `spectra scaling`), so a
    rescaled plan would be a guess. Anything else is one line."""
    import json

    where = "the k plan"
    if not isinstance(plan, dict):
        path = Path(plan)
        where = f"the k plan {path}"
        try:
            plan = json.loads(path.read_text())
        except FileNotFoundError:
            raise SpectraError(f"k plan {path} does not exist; write one with spectra plan-k RUN --out {path}") from None
        except (OSError, ValueError, UnicodeDecodeError) as error:
            raise SpectraError(f"k plan {path} is not JSON ({str(error).splitlines()[0]})") from None
    try:
        layers = sorted(plan["layers"], key=lambda entry: int(entry["layer"]))
        found = tuple(int(entry["budget"] if "budget" in entry else entry[OLD_KEY]) for entry in layers)
        positions = [int(entry["layer"]) for entry in layers]
    except (KeyError, TypeError, ValueError):
        raise SpectraError("the k plan has no list of layers with a layer and a budget each: write it with "
                           "spectra plan-k") from None
    if positions != list(range(len(found))) or not found:
        raise SpectraError(f"the k plan's layers are {positions}, not 0…{len(found) - 1}: write it with spectra plan-k")
    for k in found:
        if k < 1:
            raise SpectraError(f"the k plan asks for k = {k}: every layer's budget must be at least 1")
    made_at = plan.get("n")
    if n is not None and made_at is not None and made_at != n:
        raise SpectraError(f"{where} was made at n = {made_at} but this run has "
                           f"{spell(f'--length {n}', f'length={n}')}; make a plan at this length: spectra plan-k on an "
                           f"analyze run with --length {n}")
    return found
