"""The task paragraphs' renderers (analyses/readme_tasks.py) on task runs whose per-example scores are set by hand:
every quoted value is recounted here from the examples, tasks whose full cache fails are left out of the press
table, and the NLL and task rankings are compared as the prose says."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from spectra.report.evaluate import TaskRun
from spectra.kv.tasks.summary import task_scores

from . import conftest  # noqa: F401  (puts analyses/ on the path)

import readme_tasks as tasks_module  # noqa: E402

#: per task, the share of examples each cell answers: full, then (press, ratio)
ANSWERED = {
    "passkey": {("full", 0.0): 1.0, ("knorm", 0.5): 0.9, ("knorm", 0.75): 0.5, ("snapkv", 0.5): 0.1,
                ("snapkv", 0.75): 0.0, ("tova", 0.5): 0.8, ("tova", 0.75): 0.6},
    "niah_single_1": {("full", 0.0): 0.9, ("knorm", 0.5): 0.7, ("knorm", 0.75): 0.4, ("snapkv", 0.5): 0.2,
                      ("snapkv", 0.75): 0.1, ("tova", 0.5): 0.9, ("tova", 0.75): 0.5},
    "vt": {("full", 0.0): 0.3, ("knorm", 0.5): 0.3, ("knorm", 0.75): 0.3, ("snapkv", 0.5): 0.3,
           ("snapkv", 0.75): 0.3, ("tova", 0.5): 0.3, ("tova", 0.75): 0.3},
}
EXAMPLES = 10


def examples_table(answered: dict, lengths=(1024,), per: int = EXAMPLES) -> pd.DataFrame:
    """One row per cell and example: the first `share · per` examples of a task and length answer (score 1); the
    needle's share kept is 1 where answered, 0.4 where not (so survival predicts the score)."""
    rows, example = [], 0
    for task, cells in answered.items():
        for length in lengths:
            share = cells if not isinstance(cells, dict) or ("full", 0.0) in cells else cells[length]
            for i in range(per):
                for (press, ratio), fraction in share.items():
                    hit = float(i < round(fraction * per))
                    rows.append({"press": press, "ratio": ratio, "example": example, "task": task, "length": length,
                                 "depth": i / (per - 1), "prediction": "x", "score": hit, "kept": 1 - ratio,
                                 "needle_kept": 1.0 if press == "full" else (1.0 if hit else 0.4)})
                example += 1
    return pd.DataFrame(rows)


def task_run(examples: pd.DataFrame, name: str) -> TaskRun:
    evicted = examples[examples["press"] != "full"].copy()
    full = examples[examples["press"] == "full"].set_index("example")["score"]
    evicted = evicted[evicted["score"] < evicted["example"].map(full)].assign(evicted=1, evicted_layers="0")
    return TaskRun(Path(name), {"model": {"name": "m"}, "data": {"name": name}}, examples,
                   task_scores(examples, seed=0, replicates=200), task_scores(examples, 0, ("task", "length"), 200),
                   pd.DataFrame(), evicted)


@pytest.fixture(scope="module")
def runs():
    sweep = {task: {1024: {("full", 0.0): 1.0, ("streaming", 0.5): 0.6},
                    2048: {("full", 0.0): 0.6, ("streaming", 0.5): 0.4},
                    4096: {("full", 0.0): 0.2, ("streaming", 0.5): 0.0}} for task in ("passkey", "vt")}
    sweep_examples = pd.concat([examples_table({task: cells}, lengths=(1024, 2048, 4096), per=5)
                                .assign(example=lambda frame, offset=15 * i: frame["example"] + offset)
                                for i, (task, cells) in enumerate(sweep.items())], ignore_index=True)
    nll = pd.DataFrame({"press": ["full", "knorm", "knorm", "snapkv", "snapkv", "tova", "tova", "random"],
                        "ratio": [0.0, 0.5, 0.75, 0.5, 0.75, 0.5, 0.75, 0.5],
                        "nll": [3.0, 3.3, 3.5, 3.2, 3.4, 3.1, 3.3, 4.0]})
    return {"cache": [task_run(sweep_examples, "sweep"), task_run(examples_table(ANSWERED), "presses"),
                      SimpleNamespace(path=Path("nll"), table=nll, meta={"context": 1024})]}


def test_the_story_against_nll_leaves_out_tasks_whose_baseline_fails(runs) -> None:
    rendered = tasks_module.tasks_vs_nll(runs)
    values = rendered.values
    assert values["held"] == "`passkey`, `niah_single_1`" and values["dropped"] == "`vt` (0.30)"
    # the press table: means over the held tasks' 20 examples, recounted from ANSWERED
    for press, ratio in (("knorm", 0.5), ("snapkv", 0.75), ("tova", 0.5)):
        mean = (ANSWERED["passkey"][(press, ratio)] + ANSWERED["niah_single_1"][(press, ratio)]) / 2
        assert f"{mean:.2f}" in values["table"].split(f"`{press}`")[1].split("\n")[0]
    assert values["full_score"] == "0.95" and values["examples"] == "10" and values["length"] == "1024"
    assert "| `knorm` | 0.80 | 0.45 | 3.300 | 3.500 |" in values["table"]
    assert "random" not in values["table"], "only the presses both runs measured"


def test_the_rankings_per_metric(runs) -> None:
    values = tasks_module.tasks_vs_nll(runs).values
    # at r = 0.5 over the held tasks: tova 0.85, knorm 0.80, snapkv 0.15; NLL: tova 3.1 < snapkv 3.2 < knorm 3.3
    assert values["task_order"] == "`tova` > `knorm` > `snapkv`"
    assert values["nll_order"] == "`tova` > `snapkv` > `knorm`"
    assert values["nll_best_loss"] == "+0.100" and values["task_best"] == "0.85" and values["task_worst"] == "0.15"
    scores = [0.80, 0.45, 0.15, 0.05, 0.85, 0.55]
    nll = [3.3, 3.5, 3.2, 3.4, 3.1, 3.3]
    rho = pd.Series(scores).corr(-pd.Series(nll), method="spearman")
    assert values["rho"] == f"{rho:.2f}" and values["cells"] == "6"
    claims = tasks_module.tasks_vs_nll(runs).claims
    assert claims["same-best"] is True, "tova is best on both"
    assert claims["task-worst-not-nll-worst"] is True, "snapkv is worst on the tasks, knorm on NLL"
    assert values["task_worst_press"] == "`snapkv`" and values["task_worst_nll_rank"] == "second"
    assert values["nll_worst_press"] == "`knorm`" and values["nll_worst_score"] == "0.80"
    assert claims["tasks-spread-wider"] is True and claims["rankings-disagree"] == bool(rho < 0.5)


def test_the_baseline_per_length(runs) -> None:
    values = tasks_module.tasks_vs_nll(runs).values
    assert values["lengths"] == "1024 / 2048 / 4096"
    assert values["baseline"] == "1.00 / 0.60 / 0.20"
    assert values["baseline_counts"] == "10 of 10 / 6 of 10 / 2 of 10"
    assert values["passkey"] == "5 of 5 / 3 of 5 / 1 of 5"
    claims = tasks_module.tasks_vs_nll(runs).claims
    assert claims["baseline-falls-with-length"] and claims["passkey-falls-with-length"]
    assert values["never"] == "none" and not claims["a-task-fails-at-every-length"]


def test_the_docs_detail(runs) -> None:
    rendered = tasks_module.smollm2_tasks(runs)
    values = rendered.values
    assert "| `vt` | full | 0.30 |  |  |" in values["table"]
    row = runs["cache"][1].scores.set_index(["press", "ratio", "task"]).loc[("knorm", 0.5, "passkey")]
    assert f"0.90 ({row['delta']:+.2f} [{row['delta_low']:+.2f}, {row['delta_high']:+.2f}])" in values["table"]
    assert np.isclose(row["delta"], -0.1)
    # needle survival: answered cells kept all of it, missed ones 0.4, over examples the full cache answered
    assert values["kept_answered"] == "1.00" and values["kept_missed"] == "0.40" and values["auc"] == "1.00"
    assert rendered.claims["survival-predicts-score"] and rendered.claims["missed-kept-less"]
    assert "| `passkey` | 1.00 | 0.60 | 0.20 | 0.60 | 0.40 | 0.00 |" in values["sweep_table"]
    assert values["sweep_examples"] == "5"


def test_a_block_without_its_runs_is_refused(runs) -> None:
    with pytest.raises(tasks_module.RenderError, match="several lengths"):
        tasks_module.tasks_vs_nll({"cache": runs["cache"][1:]})
    with pytest.raises(tasks_module.RenderError, match="NLL run"):
        tasks_module.tasks_vs_nll({"cache": runs["cache"][:2]})


def test_the_front_page_quotes_the_headline_only(runs) -> None:
    """Issue 37, item 7: the front page keeps a few headline numbers — the score table of the task run alone, the
    best and the worst press at half the cache — from one run; the baseline per length and NLL moved to the docs."""
    import readme_numbers

    front_tasks = readme_numbers.RENDERERS["front-tasks"].read  # the task-scores page's, `spectra.pages.task_scores`
    presses = runs["cache"][1]
    rendered = front_tasks({"cache": [presses]})
    values, claims = rendered.values, rendered.claims
    assert values["held"] == "`passkey`, `niah_single_1`" and values["dropped"] == "`vt` (0.30)"
    assert values["full_score"] == "0.95" and values["examples"] == "10" and values["length"] == "1024"
    assert "| `knorm` | 0.80 | 0.45 |" in values["table"] and "NLL" not in values["table"]
    # at half the cache: tova (0.8 + 0.9) / 2 = 0.85 best, snapkv (0.1 + 0.2) / 2 = 0.15 worst
    assert (values["best"], values["best_score"], values["worst"], values["worst_score"]) == \
        ("`tova`", "0.85", "`snapkv`", "0.15")
    assert claims["a-press-holds-at-half"] and claims["presses-spread-wide"]
    with pytest.raises(tasks_module.RenderError, match="on a task file once, got 2 task runs"):
        front_tasks(runs)
