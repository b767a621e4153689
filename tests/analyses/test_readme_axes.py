"""The axis paragraphs' renderers (analyses/readme_axes.py) on hand-made runs: per-head errors and bytes set by hand
for an NLL run, a `spectra heads` diagnosis, and task runs whose per-example scores are set by hand. Every value
quoted is recounted here with plain loops (the least error per head among the cells that fit, the mean score of a
cell's examples), and the claims that the mixed plan ties, loses to or beats the best single axis follow the
scores."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from spectra.report.evaluate import TaskRun

from . import conftest  # noqa: F401  (puts analyses/ on the path)

import readme_axes  # noqa: E402
from readme_values import RenderError  # noqa: E402

#: the NLL run's cells: (press, ratio) → the share of the bytes each head's cache stores
BYTES = {("tova", 0.8): 0.2, ("tova", 0.7): 0.3, ("tova", 0.4): 0.6, ("kivi4", 0.5): 0.28, ("lowrank", 0.9): 0.1,
         ("think", 0.9): 0.55}
AXIS = {"tova": "tokens", "kivi4": "bits", "lowrank": "rank", "think": "channels"}
#: per (layer, key/value head): each cell's output error
ERRORS = {
    (0, 0): {("tova", 0.8): 0.30, ("tova", 0.7): 0.20, ("tova", 0.4): 0.10, ("kivi4", 0.5): 0.05,
             ("lowrank", 0.9): 0.90, ("think", 0.9): 0.40},
    (0, 1): {("tova", 0.8): 0.10, ("tova", 0.7): 0.04, ("tova", 0.4): 0.02, ("kivi4", 0.5): 0.06,
             ("lowrank", 0.9): 0.80, ("think", 0.9): 0.30},
    (1, 0): {("tova", 0.8): 0.95, ("tova", 0.7): 0.50, ("tova", 0.4): 0.30, ("kivi4", 0.5): 0.01,
             ("lowrank", 0.9): 0.70, ("think", 0.9): 0.60},
    (1, 1): {("tova", 0.8): 0.40, ("tova", 0.7): 0.30, ("tova", 0.4): 0.20, ("kivi4", 0.5): 0.03,
             ("lowrank", 0.9): 0.85, ("think", 0.9): 0.50},
}
#: per (layer, key/value head): its query heads' types (two query heads a key/value head)
TYPES = {(0, 0): ("retrieval", "retrieval"), (0, 1): ("sink", "sink"), (1, 0): ("mixed", "retrieval"),
         (1, 1): ("sink", "mixed")}
SINK = {(0, 0): 0.1, (0, 1): 0.8, (1, 0): 0.2, (1, 1): 0.5}
RETRIEVAL = {(0, 0): 0.6, (0, 1): 0.05, (1, 0): 0.3, (1, 1): 0.1}
#: the task runs' cells: (press, ratio) → (mean score, bytes share); each run has the full cache
TASK_RUNS = [
    {("tova", 0.8): (0.3, 0.2), ("mixed(runs/axes-b20)", 0.8): (0.2, 0.2)},
    {("tova", 0.7): (0.8, 0.3), ("kivi4", 0.7): (1.0, 0.28), ("mixed(runs/axes)", 0.7): (1.0, 0.29)},
    {("tova", 0.4): (0.9, 0.6), ("kivi4", 0.4): (1.0, 0.28), ("mixed(runs/axes)", 0.4): (1.0, 0.4)},
    {("lowrank", 0.9): (0.0, 0.1), ("think", 0.9): (0.0, 0.555)},
]
PER_TASK = 10
TASKS = ("passkey", "niah_single_1")


def head_stats() -> pd.DataFrame:
    """cache_heads.csv: two query heads per key/value head, each with its key/value head's error."""
    rows = []
    for (layer, kv), cells in ERRORS.items():
        for head in (2 * kv, 2 * kv + 1):
            rows.append({"press": "full", "ratio": 0.0, "layer": layer, "head": head, "out_err": 0.0,
                         "bytes_share": 1.0})
            rows += [{"press": press, "ratio": ratio, "layer": layer, "head": head, "out_err": error,
                      "bytes_share": BYTES[(press, ratio)]} for (press, ratio), error in cells.items()]
    return pd.DataFrame(rows)


def diagnosis() -> pd.DataFrame:
    rows = []
    for (layer, kv), types in TYPES.items():
        for i, kind in enumerate(types):
            rows.append({"layer": layer, "head": 2 * kv + i, "kv_head": kv, "head_type": kind,
                         "sink_share": SINK[(layer, kv)], "retrieval": RETRIEVAL[(layer, kv)], "local": 0.1,
                         "induction_score": 0.0, "entropy": 3.0, "rank90": 10.0})
    return pd.DataFrame(rows)


def task_run(cells: dict, name: str) -> TaskRun:
    """A task run: the first round(score · 10) examples of each task answer."""
    rows = []
    for (press, ratio), (score, share) in {("full", 0.0): (1.0, 1.0), **cells}.items():
        for t, task in enumerate(TASKS):
            for i in range(PER_TASK):
                rows.append({"press": press, "ratio": ratio, "example": t * PER_TASK + i, "task": task,
                             "length": 1024, "score": float(i < round(score * PER_TASK)), "bytes_share": share})
    return TaskRun(Path(name), {"model": {"name": "m"}, "data": {"name": "t.jsonl"}}, pd.DataFrame(rows),
                   pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())


def make_runs(task_runs=TASK_RUNS) -> dict:
    nll = SimpleNamespace(path=Path("axes"), head_stats=head_stats(), axes=None,
                          meta={"model": {"kv_heads": 2}, "bytes_kept": [0.3, 0.6], "samples": 3,
                                "continuation": 128})
    return {"heads": [SimpleNamespace(diagnosis=diagnosis())],
            "cache": [nll, *(task_run(cells, f"tasks-{i}") for i, cells in enumerate(task_runs))]}


def recount_winners(budget: float) -> dict[tuple[int, int], str]:
    """Per key/value head, the axis of the least error among the cells that fit `budget` (plain loops)."""
    found = {}
    for head, cells in ERRORS.items():
        fitting = [(error, press) for (press, ratio), error in cells.items() if BYTES[(press, ratio)] <= budget]
        found[head] = AXIS[min(fitting)[1]]
    return found


def test_the_map_counts_the_heads_each_axis_wins() -> None:
    """Heads won per axis at the run's budgets and the mixed plan's (0.2, from the mixed cell at r = 0.8), recounted;
    the turn is where bits start winning most, and the token heads there are described from the diagnosis."""
    rendered = readme_axes.axes_summary(make_runs())
    budgets = [0.2, 0.3, 0.6]
    winners = {budget: recount_winners(budget) for budget in budgets}
    for axis in ("tokens", "channels", "rank", "bits"):
        expected = " / ".join(str(sum(w == axis for w in winners[b].values())) for b in budgets)
        assert rendered.values[f"{axis}_wins"] == expected
    assert rendered.values["budgets"] == "0.2 / 0.3 / 0.6" and rendered.values["kv_heads"] == "4"
    assert rendered.values["bits_wins"] == "0 / 3 / 3" and rendered.values["tokens_wins"] == "3 / 1 / 1"
    assert rendered.values["rank_wins"] == "1 / 0 / 0"
    assert rendered.values["turn"] == "0.3" and rendered.values["token_heads"] == "1"
    assert rendered.values["token_types"] == "1 sink"  # head (0, 1): sink + sink
    assert rendered.values["token_sink"] == "0.80" and rendered.values["token_retrieval"] == "0.05"
    bit_heads = [head for head, axis in winners[0.3].items() if axis == "bits"]
    assert rendered.values["bit_sink"] == f"{pd.Series([SINK[h] for h in bit_heads]).median():.2f}"
    assert rendered.claims["bits-win-most-from-turn"] and rendered.claims["token-heads-mostly-sink"]
    assert rendered.claims["token-heads-sinkier"] and rendered.claims["token-heads-retrieve-less"]
    assert rendered.claims["tokens-win-most-at-lowest"]
    assert rendered.claims["rank-never-wins-above-lowest"] and rendered.claims["channels-never-win"]


def test_the_mixed_plan_against_each_single_axis() -> None:
    """Per budget, each axis' best cell among those whose bytes fit (kivi4 run at two ratios is one cell), the full
    cache beside; the mixed plan ties kivi4 at 0.6 and 0.3 and loses to tova at 0.2."""
    rendered = readme_axes.axes_summary(make_runs())
    rows = [line.split(" | ") for line in rendered.values["table"].splitlines()[2:]]
    assert [row[0].strip("| ") for row in rows] == ["0.6", "0.3", "0.2"]
    assert rows[0][1] == "1.00 (1.000)" and rows[0][2] == "1.00 (0.400)"
    assert rows[0][3] == "0.90 (`tova` r = 0.4, 0.600)" and rows[0][4] == "0.00 (`think` r = 0.9, 0.555)"
    assert rows[0][5] == "0.00 (`lowrank` r = 0.9, 0.100)" and rows[0][6].startswith("1.00 (`kivi4`, 0.280)")
    assert rows[1][3] == "0.80 (`tova` r = 0.7, 0.300)" and rows[1][4] == "— (cannot fit)"
    assert rows[2][2] == "0.20 (0.200)" and rows[2][3] == "0.30 (`tova` r = 0.8, 0.200)"
    assert rows[2][6].startswith("— (cannot fit)")
    values = rendered.values
    assert values["best_upper"] == "`kivi4` / `kivi4`" and values["upper"] == "0.6 / 0.3"
    assert (values["best_lowest"], values["best_lowest_score"], values["mixed_lowest"]) == ("`tova`", "0.30", "0.20")
    assert values["full"] == "1.00" and values["examples"] == "20" and values["length"] == "1024"
    assert values["tasks"] == "`passkey`, `niah_single_1`"
    claims = rendered.claims
    assert claims["mixed-ties-best-above-lowest"] and claims["mixed-below-best-at-lowest"]
    assert claims["mixed-beats-no-axis"] and claims["bits-best-above-lowest"]
    assert claims["mixed-keeps-full-above-lowest"]


def test_a_mixed_plan_that_wins_flips_the_claims() -> None:
    """Had the plan answered 0.4 at 0.2 of the bytes it would beat tova there: the claims that it loses and that it
    beats no axis fail, so the prose saying so fails --check."""
    runs = [dict(TASK_RUNS[0]), *TASK_RUNS[1:]]
    runs[0][("mixed(runs/axes-b20)", 0.8)] = (0.4, 0.2)
    claims = readme_axes.axes_summary(make_runs(runs)).claims
    assert not claims["mixed-below-best-at-lowest"] and not claims["mixed-beats-no-axis"]
    assert claims["mixed-ties-best-above-lowest"]


def test_the_detail_lists_every_cell_by_budget() -> None:
    """docs/cache.md's tables: heads won and median errors per budget, and every task cell (kivi4 once) under the
    smallest of the plan's budgets its bytes fit, best score first."""
    rendered = readme_axes.smollm2_axes(make_runs())
    map_rows = [line.split(" | ") for line in rendered.values["map_table"].splitlines()[2:]]
    assert [row[0].strip("| ") for row in map_rows] == ["0.2", "0.3", "0.6"]
    median_tokens = pd.Series([cells[("tova", 0.7)] for cells in ERRORS.values()]).median()
    assert map_rows[1][6].strip(" |").split(" / ")[0] == f"{median_tokens:.3g}"
    assert map_rows[1][5] == "1 `tova` r = 0.7"
    cells = [line.split(" | ") for line in rendered.values["task_table"].splitlines()[2:]]
    named = [(row[0].strip("| "), row[1]) for row in cells]
    assert named == [("—", "full"), ("0.6", "**mixed plan**"), ("0.6", "`tova` r = 0.4"), ("0.6", "`think` r = 0.9"),
                     ("0.3", "**mixed plan**"), ("0.3", "`kivi4`"), ("0.3", "`tova` r = 0.7"),
                     ("0.2", "`tova` r = 0.8"), ("0.2", "**mixed plan**"), ("0.2", "`lowrank` r = 0.9")]
    assert rendered.values["snapkv_lowest"] == "0" and rendered.values["nll_sequences"] == "3"


def test_runs_without_a_mixed_plan_or_a_map_are_refused() -> None:
    with pytest.raises(RenderError, match="mixed plan"):
        readme_axes.axes_summary(make_runs([TASK_RUNS[3]]))
    runs = make_runs()
    runs["cache"] = runs["cache"][1:]
    with pytest.raises(RenderError, match="once on text"):
        readme_axes.axes_summary(runs)
