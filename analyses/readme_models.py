"""The renderers of docs/leaderboard.md's second model and its bridge: what of the board holds on another model (the
same presses on the same needles with SmolLM2 and Gemma 3, `spectra.report.models`), and whether a head's spectrum
predicts what a press keeps there (`spectra.report.bridge`: an analyze run beside task runs of the same model).

Both read published folders (`spectra publish`), so each value re-derives from committed per-example data; the
claims the prose makes on them are decided here, on the runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from readme_boards import signed, task_runs
from readme_values import RenderError, Runs, table, two
from slots import Rendered
from spectra.errors import SpectraError
from spectra.report import evaluate, leaderboard, ranks
from spectra.report.arms import HOLDS, compared, ranked
from spectra.report.bridge import MEASURES, REFERENCES, budget_comparison, correlations, join
from spectra.report.markdown import interval, with_interval
from spectra.report.models import model_name, paired

#: the fewest compressed heads a correlation is quoted over (Gemma 3 270M compresses 3 global heads under `keep`)
FEWEST_HEADS = 10
#: the uniform presses AdaKV(SnapKV) is compared with, example by example
UNIFORM = ("snapkv", "kvpress:snapkv")
#: the most left-out cells the prose names one by one
MANY_LEFT_OUT = 4
#: a correlation the prose calls strong
STRONG = 0.5
#: the presses that prefill whole-model passes over the context (a reconstruction, a repeat, a replay)
WHOLE_MODEL = ("kvpress:kvzip", "kvgrad", "kvcompose")
#: the press that drops tokens at random, the floor the tail is read against
RANDOM = "kvpress:random"
#: how the tables head each measure
HEADINGS = {"c_at": "c@n/4", "rank90": "rank90 of P", "entropy": "entropy", "sink": "sink mass",
            "key_rank90_before_rope": "key rank90 before RoPE", "key_rank90_after_rope": "key rank90 after RoPE"}


def correlation(cell: pd.Series) -> str:
    """A correlation `rho` with its interval (`low`, `high`): '+0.12 [+0.05, +0.20]'."""
    return evaluate.with_interval(cell["rho"], cell["low"], cell["high"], sign="+")


def left_out(cells: pd.DataFrame) -> str:
    """The press × ratio cells too few heads were compressed in to correlate over: each named where a few, else
    counted with the range of their heads."""
    cells = cells[["press", "ratio", "heads"]].drop_duplicates()
    if len(cells) <= MANY_LEFT_OUT:
        return ", ".join(f"`{press}` at r = {ratio:g} ({heads})" for press, ratio, heads in
                         cells.itertuples(index=False)) or "none"
    low, high = int(cells["heads"].min()), int(cells["heads"].max())
    return (f"{len(cells)} cells of {cells['press'].nunique()} presses, "
            f"{low if low == high else f'{low}–{high}'} heads compressed in each")


def uniform_twin(rows: pd.DataFrame, press: str, uniform: tuple[str, ...]) -> str:
    """The press of `uniform` whose answers and needle kept equal `press`'s on every example at every ratio both ran
    (named in backticks), or "": with one key/value head per layer (Gemma 3) AdaKV has no heads to share a layer's
    budget among, and answers as the uniform press it wraps."""
    for group in alike(rows[rows["press"].isin([press, *uniform])], ("prediction", "needle_kept")):
        if press in group:
            return next(f"`{other}`" for other in uniform if other in group)
    return ""


def leaderboard_bridge(runs: Runs) -> Rendered:
    """A head's spectrum against the needle a press kept there: per press and ratio, Spearman's ρ of each measure
    with the heads' survival [95% interval over the questions] where the press compressed at least `FEWEST_HEADS`
    heads, the strongest correlation whose interval excludes 0, and the spectrum-set budget (`headbudget(…)`) against
    AdaKV and SnapKV at the same bytes; claims on both. The task runs read are those of the analyze run's model."""
    analyses, found = runs.get("analyze", []), task_runs(runs)
    if len(analyses) != 1:
        raise RenderError(f"the block must run one `spectra analyze` of the model, got {len(analyses)}")
    # a block may run another model's task runs too (the two-model comparison's): the analyze run's model's are read
    found = [run for run in found if model_name([run]) == model_name([analyses[0]])] or found
    try:
        bridge = join(analyses[0], found)
        every = leaderboard.pooled(found)
        rows = leaderboard.chosen(every, leaderboard.HOLDS, "answered")
        budgets = [press for press in dict.fromkeys(rows["press"]) if press.startswith("headbudget(")]
        if len(budgets) != 1:
            raise RenderError(f"the runs must hold one headbudget(…) press, got {len(budgets)}")
        references = [press for press in REFERENCES if press in set(rows["press"])]
        budget = budget_comparison(rows, budgets[0], references, bridge.seed)
    except SpectraError as error:
        raise RenderError(str(error)) from None
    found_rho = correlations(bridge)
    quoted = found_rho[found_rho["heads"] >= FEWEST_HEADS]
    names = [name for name in MEASURES if name in set(found_rho["measure"])]
    cells = list(dict.fromkeys(zip(quoted["press"], quoted["ratio"])))
    grid = quoted.set_index(["press", "ratio", "measure"])
    rho_rows = [[f"`{press}`", f"{ratio:g}", str(int(grid.loc[(press, ratio, names[0]), "heads"])),
                 *(correlation(grid.loc[(press, ratio, name)]) for name in names)]
                for press, ratio in cells]
    excludes = quoted[(quoted["low"] > 0) | (quoted["high"] < 0)]
    # the budget's own ρ with the measure it is set from is its design, not a finding: the others are read
    free = excludes[~excludes["press"].str.startswith("headbudget(")]
    strongest = free.loc[free["rho"].abs().idxmax()] if len(free) else None
    design = quoted[quoted["press"].str.startswith("headbudget(") & (quoted["measure"] == "rank90")]
    per_reference = {reference: budget[budget["reference"] == reference].set_index("ratio")
                     for reference in references}
    ratios = sorted(budget["ratio"].unique())
    budget_rows = []
    for ratio in ratios:
        mine = budget[budget["ratio"] == ratio].iloc[0]
        row = [f"{ratio:g}", two(mine["score"])]
        for reference in references:
            other = per_reference[reference].loc[ratio]
            row += [two(other["reference_score"]), signed(other, "delta")]
        row.append(f"{mine['bytes_share']:.3f}" + (", the same bytes" if budget.loc[budget["ratio"] == ratio,
                                                                                   "same_bytes"].all() else ", not"))
        budget_rows.append(row)
    adakv = per_reference.get("adakv(snapkv)")
    if adakv is None:
        raise RenderError("the runs lack adakv(snapkv), the budget the spectrum-set one is compared with")
    values = {"model": str(analyses[0].meta["model"]["name"]), "questions": str(len(bridge.records)),
              "heads": str(int(np.prod(bridge.shape))),
              "fewest": str(FEWEST_HEADS),
              "left_out": left_out(found_rho[found_rho["heads"] < FEWEST_HEADS]),
              "compressed": str(int(found_rho["heads"].max())),
              "rho_table": (table(["press", "r", "heads compressed", *(HEADINGS.get(name, name) for name in names)],
                                  rho_rows) if rho_rows else "none"),
              "excluding_zero": f"{len(excludes)} of {len(quoted)}",
              "design": ("" if design.empty else f"{design['rho'].min():+.2f} to {design['rho'].max():+.2f}"),
              "strongest": ("none" if strongest is None else
                            f"{strongest['measure']} with `{strongest['press']}` at r = {strongest['ratio']:g}: "
                            f"{correlation(strongest)}"),
              "budget": f"`{budgets[0]}`",
              "budget_table": table(["r", "headbudget", *(f"{column} {reference}" for reference in references
                                                          for column in ("score", "Δ vs")), "bytes share"],
                                    budget_rows),
              "budget_above": ", ".join(f"{ratio:g}" for ratio in adakv.index[adakv["delta_low"] > 0]) or "none",
              "budget_below": ", ".join(f"{ratio:g}" for ratio in adakv.index[adakv["delta_high"] < 0]) or "none"}
    values["adakv_same_as"] = uniform_twin(every, "adakv(snapkv)", UNIFORM) or "none"
    scored = quoted[~quoted["press"].str.startswith("headbudget(")].set_index(["press", "ratio", "measure"])
    by_cell = scored.groupby(level=["press", "ratio"])
    claims = {"some-correlation-excludes-zero": bool(len(excludes)),
              "higher-rank-keeps-more": bool(len(scored)) and bool(
                  (scored.xs("rank90", level="measure")["low"] > 0).all()
                  and (scored.xs("c_at", level="measure")["high"] < 0).all()),
              "adakv-follows-entropy": bool(len(scored)) and all(
                  cell.droplevel(["press", "ratio"])["rho"].abs().idxmax() == "entropy"
                  for (press, _), cell in by_cell if press == "adakv(snapkv)"),
              "budget-below-adakv-at-every-ratio": bool((adakv["delta_high"] < 0).all()),
              "no-strong-correlation": strongest is None or abs(strongest["rho"]) < STRONG,
              "budget-never-beats-adakv": not (adakv["delta_low"] > 0).any(),
              "budget-loses-to-adakv-somewhere": bool((adakv["delta_high"] < 0).any()),
              "budget-beats-adakv-somewhere": bool((adakv["delta_low"] > 0).any()),
              "budget-beats-adakv-at-the-lowest-ratio": bool(adakv.sort_index()["delta_low"].iloc[0] > 0),
              "too-few-heads-compressed": quoted.empty,
              "equal-bytes": bool(budget["same_bytes"].all()),
              "adakv-answers-as-uniform": values["adakv_same_as"] != "none"}
    return Rendered(values, claims)


def alike(rows: pd.DataFrame, columns: tuple[str, ...] = ("prediction",)) -> list[list[str]]:
    """The groups of presses (two or more, the full cache left out) whose `columns` (their answers) are the same on
    every example at every ratio of `rows` (one model's): a wrapper with nothing to do on a model (AdaKV over one
    key/value head a layer) or a configuration equal to another press."""
    groups: dict[tuple, list[str]] = {}
    for press, mine in rows[rows["press"] != "full"].groupby("press", sort=False):
        mine = mine.sort_values(["ratio", *ranks.units(mine)])
        key = (tuple(mine["ratio"]), tuple(mine["example"]), *(tuple(mine[column]) for column in columns))
        groups.setdefault(key, []).append(press)
    return [group for group in groups.values() if len(group) > 1]


def named_groups(groups: list[list[str]]) -> str:
    """'`a` = `b`, `c` = `d`', or 'none'."""
    return ", ".join(" = ".join(f"`{press}`" for press in group) for group in groups) or "none"


def leaderboard_models(runs: Runs) -> Rendered:
    """The same presses on the same needles with two models: each model's full cache per task, per press and ratio
    both scores with the paired difference and each model's verdict against its own full cache, the verdicts that
    flip, each model's ranking and Kendall's τ between them; claims on which conclusions hold on both."""
    found = task_runs(runs)
    names = list(dict.fromkeys(model_name([run]) for run in found))
    if len(names) != 2:
        raise RenderError(f"the block must run task runs of two models, got {len(names)} ({', '.join(names)})")
    first, second = ([run for run in found if model_name([run]) == name] for name in names)
    try:
        pair = paired(first, second)
    except SpectraError as error:
        raise RenderError(str(error)) from None
    one, two_ = pair.arms
    seed = leaderboard.seed_of(first)
    cells, (order, tau) = compared(pair.rows, seed, pair.arms), ranked(pair.rows, seed, pair.arms)
    base = pair.baseline.pivot(index="task", columns="model", values="full").reindex(columns=list(pair.arms))
    held = pair.baseline.groupby("task", sort=False)["held"].first()
    baseline = table(["task", one, two_, "compared"],
                     [[f"`{task}`", two(base.loc[task, one]), two(base.loc[task, two_]), "yes" if held[task] else "no"]
                      for task in held.index])
    pressed = cells[cells["press"] != "full"]
    ratios = sorted(pressed["ratio"].unique())
    cell_rows = []
    for press, mine in pressed.groupby("press", sort=False):
        row = [f"`{press}`"]
        for ratio in ratios:
            cell = mine[mine["ratio"] == ratio].iloc[0]
            mark = " ⇄" if cell["flips"] else ""
            row.append(f"{two(cell[one])} / {two(cell[two_])} "
                       f"({signed(cell, 'delta')}){mark}")
        cell_rows.append(row)
    ranking = table(["press", *(f"{column}, {arm}" for arm in pair.arms for column in ("mean", "rank", "tier"))],
                    [[f"`{row['press']}`", *(str(value) if column != "score" else two(value) for arm in pair.arms
                                              for column, value in (("score", row[f"{arm}_score"]),
                                                                    ("rank", row[f"{arm}_rank"]),
                                                                    ("tier", row[f"{arm}_tier"])))]
                     for _, row in order.iterrows()])
    flips = pressed[pressed["flips"]]
    full = cells[cells["press"] == "full"].iloc[0]
    # the leaders: the first tier, the presses no paired test separates from the first
    top = {arm: order.sort_values(f"{arm}_rank", kind="stable").loc[lambda found: found[f"{arm}_tier"] == 1,
                                                                     "press"].tolist() for arm in pair.arms}
    values = {"first": one, "second": two_, "baseline": baseline,
              "held": ", ".join(f"`{task}`" for task in held.index[held.to_numpy(dtype=bool)]),
              "examples": str(int(full["examples"])),
              "full_first": with_interval(full[one], full[f"{one}_low"], full[f"{one}_high"]),
              "full_second": with_interval(full[two_], full[f"{two_}_low"], full[f"{two_}_high"]),
              "table": table(["press", *(f"r = {ratio:g}" for ratio in ratios)], cell_rows), "ranks": ranking,
              "presses": str(tau["presses"]), "tau": two(tau["tau"]), "tau_interval": interval(tau["low"], tau["high"]),
              "cells": str(len(pressed)), "flips": str(len(flips)),
              "flipped": ", ".join(f"`{row.press}` at r = {row.ratio:g}" for row in flips.itertuples()) or "none",
              "top_first": ", ".join(f"`{press}`" for press in top[one]),
              "top_second": ", ".join(f"`{press}`" for press in top[two_])}
    # the tail: the presses in the last tier on both models
    last = {arm: set(order.loc[order[f"{arm}_tier"] == order[f"{arm}_tier"].max(), "press"]) for arm in pair.arms}
    tail = [press for press in order["press"] if all(press in last[arm] for arm in pair.arms)]
    lower = [press for press, mine in pressed.groupby("press", sort=False) if (mine["delta_high"] < 0).all()]
    agree = pressed[~pressed["flips"]]
    lowest = pressed[pressed["ratio"] == ratios[0]].set_index("press")
    stored = pair.rows[pair.rows["press"] != "full"].groupby(["arm", "ratio"])["bytes_share"].mean()
    values.update({
        "tail": ", ".join(f"`{press}`" for press in tail) or "none",
        "lower": ", ".join(f"`{press}`" for press in lower) or "none",
        "agree": f"{len(agree)} of {len(pressed)}", "lowest": f"{ratios[0]:g}",
        "bytes_second": ", ".join(f"{stored.loc[(two_, ratio)]:.3f} at r = {ratio:g}" for ratio in ratios),
        "bytes_first": ", ".join(f"{stored.loc[(one, ratio)]:.3f} at r = {ratio:g}" for ratio in ratios),
        "alike_first": named_groups(alike(pair.rows[pair.rows["arm"] == one])),
        "alike_second": named_groups(alike(pair.rows[pair.rows["arm"] == two_]))})
    verdicts = {arm: pressed.groupby("press")[f"{arm}_verdict"].apply(set) for arm in pair.arms}
    claims = {"ranking-related": bool(tau["low"] > 0), "ranking-changes": bool(tau["low"] < 1 and tau["tau"] < 1),
              "same-tail": bool(tail), "random-in-shared-tail": RANDOM in tail,
              "second-leaders-lead-first": set(top[two_]) <= set(top[one]),
              "flips-only-at-lowest-ratio": bool(len(flips)) and bool((flips["ratio"] == ratios[0]).all()),
              "whole-model-passes-hold-only-on-second": all(
                  press in lowest.index and lowest.loc[press, "flips"]
                  and lowest.loc[press, f"{two_}_verdict"] == HOLDS for press in WHOLE_MODEL),
              "whole-model-passes-lose-on-second-above-lowest": all(
                  (pressed[(pressed["press"] == press) & (pressed["ratio"] > ratios[0])][f"{two_}_verdict"]
                   != HOLDS).all() for press in WHOLE_MODEL),
              "some-lower-on-second": bool(lower),
              "agreeing-verdicts-all-lose": bool(len(agree)) and bool((agree[f"{one}_verdict"] != HOLDS).all()),
              "none-holds-on-both": not any(HOLDS in verdicts[one][press] and HOLDS in verdicts[two_][press]
                                            for press in verdicts[one].index),
              "some-verdicts-flip": bool(len(flips)), "most-verdicts-agree": bool(len(flips) < len(pressed) / 2),
              "same-leader": bool(set(top[one]) & set(top[two_])),
              "second-removes-fewer-bytes": all(stored.loc[(two_, ratio)] > stored.loc[(one, ratio)]
                                                for ratio in ratios)}
    return Rendered(values, claims)

