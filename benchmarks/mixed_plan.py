"""Issue 32, item 4: the best axis per head and the mixed plan against every single axis, as markdown tables.

    python benchmarks/mixed_plan.py --axes AXES_RUN --tasks TASK_RUN [TASK_RUN …] [--budgets 0.3,0.6]
    python benchmarks/mixed_plan.py --axes AXES_RUN --write-map 0.2 --heads HEADS_RUN --out DIR

AXES_RUN is a `spectra cache --bytes-kept … --heads-run …` run (the NLL protocol): its cache_axes.csv gives, per byte
budget, how many key/value heads each axis is best for, and the axes' median errors; beside the diagnosis of
`spectra heads`, which axis each kind of head prefers. TASK_RUN are task-protocol runs of the same model (task files
from `spectra tasks`): every cell's mean score per task and the share of the context cache's bytes it stored, grouped
by the budget it fits (the smallest of --budgets not below its bytes), so each single axis is read at the bytes it
really used, beside the full cache and `mixed(AXES_RUN)`. Reads run directories only; `--write-map` writes DIR/
cache_axes.csv at other budgets from AXES_RUN's own per-head rows (what `--bytes-kept` would have written), for
`mixed(DIR)`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spectra.kv.axes import dominant_type, summary

#: slack on "fits the budget" (a ThinK mask of ⌈d/8⌉ bytes per head is 1e-5 of a 1k cache)
SLACK = 1e-3


def markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """A DataFrame as a markdown table, floats rounded."""
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(f"{value:.{digits}f}" if isinstance(value, float) else str(value)
                                       for value in row) + " |")
    return "\n".join(lines)


def map_tables(run: Path) -> str:
    """The per-budget summary and, with a diagnosis joined, the best axis by the key/value head's head types."""
    axes = pd.read_csv(run / "cache_axes.csv")
    out = ["### The axis that loses least, per budget", "", markdown(summary(axes), 4), ""]
    best = axes[axes["best"]]
    winners = best.groupby(["budget", "axis", "press", "ratio"]).size().rename("heads").reset_index()
    out += ["### The winning press of each key/value head", "", markdown(winners), ""]
    if "head_types" in best:
        dominant = dominant_type(best["head_types"])
        table = pd.crosstab([best["budget"], dominant.rename("dominant head type")], best["axis"]).reset_index()
        out += ["### Best axis by the dominant head type of the key/value head's query heads (spectra heads)", "",
                markdown(table), ""]
        scores = [name for name in ("retrieval", "sink_share", "local", "rank90") if name in best]
        medians = best.groupby(["budget", "axis"])[scores].median().reset_index()
        out += ["### Median diagnosis of the heads each axis wins", "", markdown(medians, 3), ""]
    return "\n".join(out)


def task_table(runs: list[Path], budgets: list[float]) -> str:
    """Per task: every cell's score and bytes share, grouped by the budget it fits."""
    scores = pd.concat([pd.read_csv(run / "task_scores.csv") for run in runs], ignore_index=True)
    scores = scores.drop_duplicates(["press", "ratio", "task"])
    wide = scores.pivot_table(index=["press", "ratio"], columns="task", values="score", sort=False).reset_index()
    shares = scores.groupby(["press", "ratio"], sort=False)["bytes_share"].mean().reset_index()
    wide = wide.merge(shares, on=["press", "ratio"])
    fits = [min([b for b in budgets if b + SLACK >= share], default=float("nan")) for share in wide["bytes_share"]]
    wide.insert(0, "budget", fits)
    wide["mean"] = wide[[column for column in scores["task"].unique()]].mean(axis=1)
    return markdown(wide.sort_values(["budget", "mean"], ascending=[True, False], na_position="first"))


def write_map(run: Path, budgets: list[float], heads: Path | None, out: Path) -> Path:
    """OUT/cache_axes.csv: AXES_RUN's axis map at `budgets` (spectra.kv.axes.best_axes on its cache_heads.csv)."""
    import spectra
    from spectra.kv import axes
    from spectra.kv.presses import REGISTRY

    cache = spectra.load_run(run)
    presses = [press for press in dict.fromkeys(cache.head_stats["press"]) if press != "full"]
    mapped = axes.best_axes(cache.head_stats, {press: REGISTRY[press].axis for press in presses},
                            cache.meta["model"]["kv_heads"], budgets)
    if heads is not None:
        mapped = axes.join_diagnosis(mapped, spectra.load_run(heads).diagnosis)
    out.mkdir(parents=True, exist_ok=True)
    mapped.to_csv(out / axes.MAP_FILE, index=False)
    return out / axes.MAP_FILE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--axes", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, nargs="+", default=[])
    parser.add_argument("--budgets", default="0.3,0.6")
    parser.add_argument("--write-map", help="budgets of a map written from --axes' per-head rows into --out")
    parser.add_argument("--heads", type=Path, help="with --write-map: a heads run joined to it")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.write_map:
        print(write_map(args.axes, [float(b) for b in args.write_map.split(",")], args.heads, args.out))
        return
    print(map_tables(args.axes))
    if args.tasks:
        print("### Task scores by the budget each cell fits (bytes_share: its context cache over the full one's)\n")
        print(task_table(args.tasks, sorted(float(b) for b in args.budgets.split(","))))


if __name__ == "__main__":
    main()
