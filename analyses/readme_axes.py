"""The renderers of the axis paragraphs (issue 32): per key/value head, which axis of compression — tokens, key
channels, rank or bits — loses least at a byte budget, and the mixed plan (`mixed(RUN)`: each head its best axis)
against every single axis on tasks at equal bytes, beside the full cache.

The map is recomputed from the NLL run's per-head rows (cache_heads.csv, through `spectra.kv.axes.best_axes`, as
`spectra cache --bytes-kept` writes cache_axes.csv) at the run's budgets and at the budgets the task runs played the
mixed plan at (budget 1 − r of a `mixed` cell at ratio r), so a budget the run did not map (0.2) is read the same
way. On tasks a cell counts at a budget when the bytes its context cache stored (bytes_share, the mean over its
examples) fit the budget; each axis is read at its best-scoring cell that fits (ties to the one storing more bytes,
the closest to equal bytes), since a press that stores less than the budget may still be the axis' best use of it.
"""

from __future__ import annotations

import pandas as pd

from readme_values import RenderError, Runs, listed, only, slashed, table, two
from slots import Rendered
from spectra.kv import axes
from spectra.kv.presses import REGISTRY
from spectra.report.evaluate import TaskRun

#: slack on "fits the budget": a ThinK channel mask of ⌈d/8⌉ bytes a head is 1e-5 of a 1k-token cache
SLACK = 1e-3
#: the axes in words, in spectra.kv.axes.AXES order
WORDS = {"tokens": "tokens", "channels": "key channels", "rank": "rank", "bits": "bits"}


def axis_runs(runs: Runs) -> tuple[object, object, list[TaskRun]]:
    """(the `spectra heads` run, the NLL run with per-head rows, the task runs) among a block's runs."""
    heads = only(runs, "heads")
    caches = runs.get("cache", [])
    text = [run for run in caches if not isinstance(run, TaskRun)]
    tasks = [run for run in caches if isinstance(run, TaskRun)]
    if len(text) != 1 or not tasks:
        raise RenderError("the block must run `spectra cache` once on text with --bytes-kept (the axis map) and at "
                          f"least once on a task file (the mixed plan), got {len(text)} and {len(tasks)}")
    return heads, text[0], tasks


def base(press: str) -> str:
    """A press's registered name ('mixed' of 'mixed(runs/axes-smol)')."""
    return press.split("(")[0]


def cells(tasks: list[TaskRun]) -> pd.DataFrame:
    """Per (press, ratio) of the task runs (a cell run twice counted once): its name, axis ('mixed', 'full' or
    the press's axis), mean score over its examples, mean bytes share, and examples."""
    examples = pd.concat([run.examples for run in tasks], ignore_index=True)
    examples = examples.drop_duplicates(["press", "ratio", "example"])
    found = examples.groupby(["press", "ratio"], sort=False).agg(
        score=("score", "mean"), bytes_share=("bytes_share", "mean"), examples=("score", "size")).reset_index()
    names = found["press"].map(base)
    kinds = [name if name in ("full", "mixed") else REGISTRY[name].axis for name in names]
    found = found.assign(name=names, axis=kinds)
    bits = found["axis"] == "bits"  # a bits press ignores the ratio: its cells at several ratios are one cell
    return pd.concat([found[~bits], found[bits].drop_duplicates(["name", "score", "bytes_share"])]).sort_index()


def mixed_budgets(table_: pd.DataFrame) -> list[float]:
    """The budgets the mixed plan ran at (1 − r of its cells), smallest first."""
    found = sorted({round(1 - ratio, 6) for ratio in table_.loc[table_["axis"] == "mixed", "ratio"]})
    if not found:
        raise RenderError("no task run plays the mixed plan (a `mixed(RUN)` press)")
    return found


def best_single(table_: pd.DataFrame, budget: float) -> dict[str, pd.Series]:
    """Per axis with a cell that fits `budget`: its best-scoring cell (ties to the larger bytes share)."""
    single = table_[~table_["axis"].isin(["full", "mixed"]) & (table_["bytes_share"] <= budget + SLACK)]
    found = {}
    for axis in axes.AXES:
        mine = single[single["axis"] == axis]
        if len(mine):
            found[axis] = mine.sort_values(["score", "bytes_share"], ascending=False, kind="stable").iloc[0]
    return found


def mixed_at(table_: pd.DataFrame, budget: float) -> pd.Series:
    rows = table_[(table_["axis"] == "mixed") & ((1 - table_["ratio"]).round(6) == budget)]
    return rows.iloc[0]


def cell_text(row: pd.Series) -> str:
    """'1.00 (`kivi4`, 0.284)': the score, the press (a token, channel or rank press with its ratio) and the share
    of the cache's bytes it stored."""
    if row["axis"] in ("mixed", "full"):
        return f"{two(row['score'])} ({row['bytes_share']:.3f})"
    press = f"`{row['name']}`" if row["axis"] in ("bits", "mixed") else f"`{row['name']}` r = {row['ratio']:g}"
    return f"{two(row['score'])} ({press}, {row['bytes_share']:.3f})"


def head_map(heads, run, budgets: list[float]) -> pd.DataFrame:
    """cache_axes.csv's map at `budgets` from the run's per-head rows, each key/value head's diagnosis joined."""
    stats = run.head_stats
    presses = [press for press in dict.fromkeys(stats["press"]) if press != "full"]
    mapped = axes.best_axes(stats, {press: REGISTRY[base(press)].axis for press in presses},
                            int(run.meta["model"]["kv_heads"]), budgets)
    return axes.join_diagnosis(mapped, heads.diagnosis)


def wins(mapped: pd.DataFrame, budgets: list[float]) -> pd.DataFrame:
    """Heads won per budget (rows) and axis (columns, every axis of AXES)."""
    best = mapped[mapped["best"]]
    counts = best.groupby(["budget", "axis"]).size().unstack("axis").reindex(index=budgets, columns=list(axes.AXES))
    return counts.fillna(0).astype(int)


def turn(counts: pd.DataFrame) -> float:
    """The smallest budget from which bits win most heads at every larger budget."""
    heads = counts.sum(axis=1)
    found = [budget for budget in counts.index if (counts.loc[budget:, "bits"] > heads.loc[budget:] / 2).all()]
    if not found:
        raise RenderError("bits win most heads at no budget of the map")
    return min(found)


def map_values(heads, run, tasks: list[TaskRun]) -> tuple[dict[str, str], dict[str, bool], pd.DataFrame,
                                                           pd.DataFrame]:
    """The map's values and claims (counts per axis and budget, the heads tokens keep winning and what they are),
    the map and the counts."""
    table_ = cells(tasks)
    budgets = sorted(set(mixed_budgets(table_)) | {float(b) for b in run.meta.get("bytes_kept", [])})
    mapped = head_map(heads, run, budgets)
    counts = wins(mapped, budgets)
    at = turn(counts)
    best = mapped[mapped["best"] & (mapped["budget"] == at)]
    token_heads, bit_heads = best[best["axis"] == "tokens"], best[best["axis"] == "bits"]
    types = axes.dominant_type(token_heads["head_types"]).value_counts()
    heads_at = mapped[mapped["budget"] == at].drop_duplicates(["layer", "kv_head"])
    every = axes.dominant_type(heads_at["head_types"]).value_counts()
    values = {"kv_heads": str(int(counts.sum(axis=1).iloc[0])), "budgets": slashed(budgets, lambda b: f"{b:g}"),
              "turn": f"{at:g}", "lowest": f"{budgets[0]:g}", "token_heads": str(len(token_heads)),
              "token_types": listed([f"{count} {kind}" for kind, count in types.items()]),
              "token_sink": two(token_heads["sink_share"].median()), "bit_sink": two(bit_heads["sink_share"].median()),
              "token_retrieval": two(token_heads["retrieval"].median()),
              "bit_retrieval": two(bit_heads["retrieval"].median()),
              "token_layers": f"{token_heads['layer'].min()}–{token_heads['layer'].max()}",
              "sink_heads": str(int(every.get("sink", 0))), "retrieval_heads": str(int(every.get("retrieval", 0))),
              "token_retrieving": str(int(types.get("retrieval", 0))),
              **{f"{axis}_wins": slashed(list(counts[axis])) for axis in axes.AXES}}
    lowest = counts.iloc[0]
    claims = {"bits-win-most-from-turn": bool(at > budgets[0]),
              "tokens-win-most-at-lowest": bool(lowest.idxmax() == "tokens"),
              "rank-never-wins-above-lowest": bool((counts["rank"].iloc[1:] == 0).all()),
              "channels-never-win": bool((counts["channels"] == 0).all()),
              "token-heads-mostly-sink": bool(len(types) and types.idxmax() == "sink"
                                              and types["sink"] > len(token_heads) / 2),
              "token-heads-sinkier": bool(token_heads["sink_share"].median() > bit_heads["sink_share"].median()),
              "token-heads-retrieve-less": bool(token_heads["retrieval"].median() < bit_heads["retrieval"].median())}
    return values, claims, mapped, counts


def plan_values(tasks: list[TaskRun]) -> tuple[dict[str, str], dict[str, bool]]:
    """The mixed plan against each single axis at the budgets it ran at, and the full cache."""
    table_ = cells(tasks)
    budgets = mixed_budgets(table_)
    full = table_[table_["axis"] == "full"]
    if full.empty:
        raise RenderError("the task runs have no full-cache cell (the baseline)")
    rows, ties, below, above, best_names = [], [], [], [], []
    for budget in sorted(budgets, reverse=True):
        mixed, single = mixed_at(table_, budget), best_single(table_, budget)
        top = max(row["score"] for row in single.values())
        winners = [row for row in single.values() if row["score"] == top]
        best_names.append(listed(f"`{row['name']}`" for row in winners))
        ties.append(mixed["score"] == top)
        below.append(mixed["score"] < top)
        above.append(mixed["score"] > top)
        rows.append([f"{budget:g}", cell_text(full.iloc[0]), cell_text(mixed),
                     *(cell_text(single[axis]) if axis in single else "— (cannot fit)" for axis in axes.AXES)])
    examples = tasks[0].examples
    full_examples = examples[examples["press"] == "full"]
    header = ["bytes budget", "full cache", "mixed plan", *(WORDS[axis] for axis in axes.AXES)]
    upper = [f"{budget:g}" for budget in sorted(budgets, reverse=True)][:-1]
    mixed_low, single_low = mixed_at(table_, budgets[0]), best_single(table_, budgets[0])
    top_low = max(single_low.values(), key=lambda row: (row["score"], row["bytes_share"]))
    values = {"table": table(header, rows), "full": two(full["score"].iloc[0]),
              "examples": str(int(full["examples"].iloc[0])),
              "tasks": listed(f"`{task}`" for task in dict.fromkeys(full_examples["task"])),
              "length": str(int(full_examples["length"].max())), "upper": slashed(upper),
              "best_upper": slashed(best_names[:-1]), "lowest": f"{budgets[0]:g}",
              "best_lowest": f"`{top_low['name']}`", "best_lowest_score": two(top_low["score"]),
              "mixed_lowest": two(mixed_low["score"])}
    claims = {"mixed-ties-best-above-lowest": bool(all(ties[:-1])), "mixed-below-best-at-lowest": bool(below[-1]),
              "mixed-beats-no-axis": bool(not any(above)),
              "bits-best-above-lowest": bool(all("`kivi" in names for names in best_names[:-1])),
              "mixed-keeps-full-above-lowest": bool(all(mixed_at(table_, b)["score"] >= full["score"].iloc[0]
                                                        for b in budgets[1:]))}
    return values, claims


def axes_summary(runs: Runs) -> Rendered:
    """docs/cache.md's summary: heads won per axis and budget, and the mixed plan against each single axis."""
    heads, run, tasks = axis_runs(runs)
    values, claims, _, _ = map_values(heads, run, tasks)
    plan, decided = plan_values(tasks)
    clash = set(values) & set(plan) - {"lowest"}
    if clash:
        raise RenderError(f"the map and the plan both give {', '.join(sorted(clash))}")
    return Rendered(values | plan, claims | decided)


def smollm2_axes(runs: Runs) -> Rendered:
    """docs/cache.md's detail: per budget the heads each axis wins and each axis' median error, the winning token
    presses, then every task cell grouped by the smallest mixed-plan budget its bytes fit."""
    heads, run, tasks = axis_runs(runs)
    values, claims, mapped, counts = map_values(heads, run, tasks)
    rows = []
    for budget in counts.index:
        here = mapped[mapped["budget"] == budget]
        medians = here.groupby("axis")["out_err"].median()
        tokens = here[here["best"] & (here["axis"] == "tokens")].groupby(["press", "ratio"]).size()
        rows.append([f"{budget:g}", *(str(counts.loc[budget, axis]) for axis in axes.AXES),
                     listed(f"{count} `{press}` r = {ratio:g}" for (press, ratio), count in tokens.items()) or "—",
                     " / ".join(f"{medians[axis]:.3g}" if axis in medians else "—" for axis in axes.AXES)])
    header = ["budget", *(f"won by {WORDS[axis]}" for axis in axes.AXES), "token heads' press",
              "median error: " + " / ".join(WORDS[axis] for axis in axes.AXES)]
    table_ = cells(tasks)
    budgets = mixed_budgets(table_)
    task_rows = [["—", "full", "1.000", two(table_.loc[table_["axis"] == "full", "score"].iloc[0])]]
    for budget in sorted(budgets, reverse=True):
        lower = max([b for b in budgets if b < budget], default=-1.0)
        here = table_[(table_["axis"] != "full") & (table_["bytes_share"] <= budget + SLACK)
                      & (table_["bytes_share"] > lower + SLACK)]
        here = here.sort_values(["score", "bytes_share"], ascending=False, kind="stable")
        for _, row in here.iterrows():
            name = "**mixed plan**" if row["axis"] == "mixed" else \
                f"`{row['name']}`" + ("" if row["axis"] == "bits" else f" r = {row['ratio']:g}")
            task_rows.append([f"{budget:g}", name, f"{row['bytes_share']:.3f}", two(row["score"])])
    plan, decided = plan_values(tasks)
    lowest = mapped[mapped["best"] & (mapped["budget"] == counts.index[0])]
    values |= {"map_table": table(header, rows), "nll_sequences": str(run.meta["samples"]),
               "continuation": str(run.meta["continuation"]),
               "snapkv_lowest": str(int((lowest["press"] == "snapkv").sum())),
               "task_table": table(["budget", "cell", "bytes kept", "mean score"], task_rows),
               **{key: plan[key] for key in ("full", "examples", "tasks", "length", "upper", "best_upper",
                                             "best_lowest", "best_lowest_score", "mixed_lowest")}}
    return Rendered(values, claims | decided)
