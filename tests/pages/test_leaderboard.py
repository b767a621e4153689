"""The leaderboard's and the many-question page's values and claims (spectra/pages/leaderboard.py, questions.py) on
two task runs whose per-example scores are set by hand: every quoted score is recounted from the examples, the
ranking's order and SnapKV's place are the means', and runs that cannot be pooled are one line (SpectraError)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from spectra.errors import SpectraError
from spectra.pages import PAGES, Sheet
from spectra.report.board import TOP
from spectra.report.evaluate import TaskRun

#: the share of each task's 10 examples a cell answers (passkey and niah held by the full cache, vt not)
ANSWERED = {("full", 0.0): (1.0, 0.9, 0.3), ("kvzip", 0.5): (1.0, 0.9, 0.3), ("kvzip", 0.75): (0.8, 0.8, 0.1),
            ("snapkv", 0.5): (0.2, 0.1, 0.0), ("snapkv", 0.75): (0.1, 0.0, 0.0)}
TASKS, EXAMPLES = ("passkey", "niah_single_1", "vt"), 10


#: the layer where each press's failures lost the whole needle from every key/value head (task_evicted.csv)
LOST_IN = {"kvzip": 0, "snapkv": 1}
#: comparisons with kvpress (`spectra.report.equality`): the full cache and kvzip equal in every answer compared,
#: snapkv in 3 of 4, question-free; kvzip differs once query-aware, and on many-question records only kvzip was compared
COMPARED = [("full", "question-free", "one", 0.0, 2, 2), ("kvzip", "question-free", "one", 0.5, 2, 2),
            ("kvzip", "question-free", "one", 0.75, 2, 2), ("snapkv", "question-free", "one", 0.5, 2, 2),
            ("snapkv", "question-free", "one", 0.75, 2, 1), ("kvzip", "query-aware", "one", 0.5, 2, 1),
            ("kvzip", "question-free", "several", 0.5, 3, 3)]


@pytest.fixture(autouse=True)
def compared(tmp_path, monkeypatch) -> Path:
    """The committed comparisons the column reads, here COMPARED (the repository's own table is left alone)."""
    from spectra.report import equality

    path = tmp_path / "kvpress-equality.csv"
    pd.DataFrame([{"press": press, "loop": loop, "questions": questions, "ratio": ratio, "data": "t.jsonl",
                   "data_sha256": "s", "compared": count, "equal": equal, "kvpress": "0.5.5"}
                  for press, loop, questions, ratio, count, equal in COMPARED],
                 columns=list(equality.COLUMNS)).to_csv(path, index=False)
    monkeypatch.setitem(COMPARED_AT, "path", str(path))
    return path


#: where the pages read the comparisons from in these tests (`compared`)
COMPARED_AT: dict[str, str] = {}


def leaderboard_page(runs: list[TaskRun]) -> Sheet:
    return PAGES["leaderboard"].render(runs, equality=COMPARED_AT["path"])


def front_leaderboard(runs: list[TaskRun]) -> Sheet:
    return PAGES["leaderboard"].render(runs, "front", equality=COMPARED_AT["path"])


def questions_page(runs: list[TaskRun]) -> Sheet:
    return PAGES["questions"].render(runs, equality=COMPARED_AT["path"])


def task_run(name: str, presses: tuple[str, ...], sha: str = "s") -> TaskRun:
    """A run of the full cache and `presses`; a press keeps the needle (share 1) where it answers and loses it
    (share 0, in layer LOST_IN[press]) where it fails."""
    rows, lost, needle = [], [], []
    full = {}
    for (press, ratio), shares in ANSWERED.items():
        if press != "full" and press not in presses:
            continue
        needle.append({"press": press, "ratio": ratio, "layer": 0, "head": 0, "needle_kept": 1.0})
        for place, (task, share) in enumerate(zip(TASKS, shares)):
            for i in range(EXAMPLES):
                example, score = place * EXAMPLES + i, float(i < round(share * EXAMPLES))
                rows.append({"press": press, "ratio": ratio, "example": example, "question": 0,
                             "task": task, "length": 1024, "depth": 1 - i / EXAMPLES,
                             "prediction": "a" if press == "full" else "b",
                             "score": score, "bytes_share": 1 - ratio, "kept": 1 - ratio, "needle_kept": score})
                full.setdefault(example, score)
                if press != "full" and score < full[example]:
                    lost.append({"press": press, "ratio": ratio, "example": example, "question": 0, "task": task,
                                 "score": score, "full": full[example], "evicted": 1,
                                 "evicted_layers": str(LOST_IN[press]), "first_evicted": LOST_IN[press]})
    meta = {"data": {"sha256": sha, "name": "t.jsonl"}, "settings": {"seed": 0}, "model": {"name": "SmolLM2"}}
    return TaskRun(Path(name), meta, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(needle),
                   pd.DataFrame(lost))


def test_the_page_quotes_the_pooled_ranking_with_intervals() -> None:
    rendered = leaderboard_page([task_run("a", ("kvzip",)), task_run("b", ("snapkv",))])
    values = rendered.values
    assert values["held"] == "`passkey`, `niah_single_1`" and values["dropped"] == "`vt` (0.30)"
    assert values["examples"] == "10" and values["total"] == "20" and values["presses"] == "2"
    assert values["first"] == "`kvzip`" and values["reference_rank"] == "2" and values["top"] == str(TOP)
    kvzip_mean = np.mean([(1.0 + 0.9) / 2, (0.8 + 0.8) / 2])
    assert values["first_score"] == f"{kvzip_mean:.2f}"
    lines = values["table"].splitlines()
    assert lines[0] == "| rank | tier | press | r = 0.5 | r = 0.75 | mean over r | rank (95%) | = kvpress (cells) |"
    assert lines[2].startswith("|  |  | full cache | 0.95 [") and lines[2].endswith("|  | 2/2 |")
    assert lines[3].startswith("| 1 | 1 | `kvzip` | 0.95 [") and lines[3].endswith(" | 1 | 4/4 |")
    assert lines[4].startswith("| 2 | 2 | `snapkv` | 0.15 [") and lines[4].endswith(" | 2 | 3/4 |")
    # only kvzip is equal to kvpress in every answer compared, of the two presses kvpress has
    assert (values["equal_to_kvpress"], values["kvpress_peers"], values["kvpress_compared"]) == ("`kvzip`", "2", "2")
    # one pair, told apart (0.85 against 0.15 on the same 20 examples): two tiers, ranks that never swap
    assert (values["pairs"], values["tiers"], values["top_tier"], values["reference_tier"]) == ("1", "2", "`kvzip`",
                                                                                                "2")
    assert values["rank_widths"] == "a median of 1 and at most 1"
    assert "**passkey** (10 examples)" in values["by_task"] and "**vt**" not in values["by_task"]
    passkey = values["by_task"].split("**niah_single_1**")[0].splitlines()
    kvzip = next(line for line in passkey if "`kvzip`" in line).split("|")
    assert kvzip[1].strip() == "1" and kvzip[-2].strip().startswith(f"{(1.0 + 0.8) / 2:.2f} [")  # passkey's own mean
    full = next(line for line in passkey if "full cache" in line).split("|")
    exact = binomtest(EXAMPLES, EXAMPLES).proportion_ci(0.95, method="exact")  # every passkey example answered
    assert full[-2].strip() == f"1.00 [{exact.low:.2f}–1.00]", "an exact binomial bound, not 1.00 [1.00–1.00]"
    niah = values["by_task"].split("**niah_single_1**")[1].split("**")[0]
    none = binomtest(0, EXAMPLES).proportion_ci(0.95, method="exact")  # snapkv keeps no niah answer at 0.75
    assert next(line for line in niah.splitlines() if "`snapkv`" in line).split("|")[4].strip() == \
        f"0.00 [0.00–{none.high:.2f}]"
    # the other filter, named: only the 10 + 9 + 3 examples the full cache answers (vt's too), kvzip keeping 22 and
    # 17 of them, snapkv 3 and 1
    assert values["answered"] == "22" and values["answered_first"] == "`kvzip`"
    answered = values["answered_table"].splitlines()
    assert answered[0] == "| rank | tier | press | mean over r | rank (95%) |"
    assert answered[2].startswith("|  |  | full cache | 1.00 [")
    assert answered[3].startswith(f"| 1 | 1 | `kvzip` | {(22 + 17) / 44:.2f} [") and answered[3].endswith(" | 1 |")
    assert answered[4].startswith(f"| 2 | 2 | `snapkv` | {(3 + 1) / 44:.2f} [") and answered[4].endswith(" | 2 |")
    # where the ranking comes from, at r = 0.5, over the 10 + 9 examples the full cache answers: kvzip keeps every
    # answer; snapkv keeps 2 + 1 and loses the needle in layer 1 in each of its 16 failures
    survival = values["survival_table"].splitlines()
    assert survival[2] == "| 1 | `kvzip` | 19 of 19 | 0 of 0 | — | 1.00 / — |"
    assert survival[3] == "| 2 | `snapkv` | 3 of 19 | 16 of 16 | 1 | 1.00 / 0.00 |"
    assert values["survival_ratio"] == "0.5" and values["survival_presses"] == "2"
    # snapkv's 3 kept answers are its tasks' first examples, whose needles lie at depth 1.0, 0.9 and 1.0; kvzip
    # keeps the whole needle where it answers (no "part")
    assert values["reference_depth"] == "0.90" and values["reference_kept"] == "3"
    assert rendered.claims == {"first-below-full": True, "reference-outside-top": False,
                               "reference-below-top-tier": True, "leaders-keep-part": False,
                               "reference-answers-late": True, "every-peer-equal": False}


def test_the_front_page_lists_the_top_of_the_ranking() -> None:
    rendered = front_leaderboard([task_run("a", ("kvzip", "snapkv"))])
    assert rendered.values["top"] == str(TOP)
    assert len(rendered.values["table"].splitlines()) == 2 + 1 + 2
    assert rendered.values["table"].splitlines()[0].startswith("| rank | tier | press |")


def test_runs_of_other_task_files_are_refused_in_one_line() -> None:
    with pytest.raises(SpectraError, match="differ in their task file"):
        leaderboard_page([task_run("a", ("kvzip",)), task_run("b", ("snapkv",), sha="x")])
    with pytest.raises(SpectraError, match="one or more task runs"):
        leaderboard_page([])


def test_many_questions_rank_presses_on_the_answers_the_full_cache_gives() -> None:
    """The same runs as many-question runs: judged on the questions the full cache answers (10 + 9 + 3 of 30), a
    cell's score is the share of those answers kept, recounted here by hand."""
    rendered = questions_page([task_run("a", ("kvzip",)), task_run("b", ("snapkv",))])
    values = rendered.values
    assert values["records"] == "30" and values["questions"] == "30" and values["answered"] == "22"
    assert values["full"].startswith(f"{(10 + 9 + 3) / 30:.2f} [")
    answered = {task: round(share * EXAMPLES) for task, share in zip(TASKS, ANSWERED[("full", 0.0)])}
    for (press, ratio), shares in ANSWERED.items():
        if press == "full":
            continue
        # the examples answered are the first ones of each task, for the full cache as for the press
        kept = sum(min(round(share * EXAMPLES), answered[task]) for task, share in zip(TASKS, shares))
        row = next(line for line in values["table"].splitlines() if f"`{press}`" in line)
        column = {0.5: 3, 0.75: 4}[ratio]  # after rank, tier and press
        assert row.split("|")[column + 1].strip().startswith(f"{kept / 22:.2f} ["), (press, ratio)
    assert values["first"] == "`kvzip`" and values["reference_rank"] == "2"
    assert rendered.claims == {"full-below-holds": True, "first-loses-some": True,  # 22 of 30; kvzip 17 of 22 at 0.75
                               "every-peer-equal": False}  # snapkv not compared on many-question records
    lines = values["table"].splitlines()
    assert lines[3].endswith(" | 3/3 |") and lines[4].endswith(" | not compared |") and lines[2].endswith(
        " | not compared |")
    # the other filter, named: every question, answered by the full cache or not (kvzip 22 and 17 of 30, snapkv 3, 1)
    every = values["all_table"].splitlines()
    assert every[2].startswith(f"|  |  | full cache | {22 / 30:.2f} [") and values["all_first"] == "`kvzip`"
    assert every[3].startswith(f"| 1 | 1 | `kvzip` | {(22 + 17) / 60:.2f} [")
    assert every[4].startswith(f"| 2 | 2 | `snapkv` | {(3 + 1) / 60:.2f} [")
    assert (values["tiers"], values["top_tier"]) == ("2", "`kvzip`")

def test_snapkv_answering_a_shallow_needle_fails_the_late_claim_and_a_partial_needle_holds_the_part_claim() -> None:
    run = task_run("a", ("kvzip", "snapkv"))
    examples = run.examples.copy()
    snapkv = examples["press"] == "snapkv"
    examples.loc[snapkv, "depth"] = 1 - examples.loc[snapkv, "depth"]  # its kept answers now lie at depth 0 and 0.1
    kvzip = (examples["press"] == "kvzip") & (examples["score"] >= 1)
    examples.loc[kvzip, "needle_kept"] = 0.6  # kvzip answers from part of the needle
    run = TaskRun(run.path, run.meta, examples, run.scores, run.lengths, run.needle, run.evicted)
    rendered = leaderboard_page([run])
    assert rendered.values["reference_depth"] == "0.00"
    assert rendered.claims["reference-answers-late"] is False and rendered.claims["leaders-keep-part"] is True


def test_a_press_that_stored_the_whole_cache_is_listed_without_a_rank_and_named() -> None:
    run = task_run("a", ("kvzip", "snapkv"))
    lazy = run.examples[run.examples["press"] == "kvzip"].assign(press="simlayerkv", bytes_share=1.0, kept=1.0)
    run = TaskRun(run.path, run.meta, pd.concat([run.examples, lazy], ignore_index=True), run.scores, run.lengths,
                  run.needle, run.evicted)
    values = leaderboard_page([run]).values
    assert values["presses"] == "2" and values["first"] == "`kvzip`"
    assert values["unranked"] == "`simlayerkv` (1.00 of the bytes at every ratio)"
    assert "| — | — | `simlayerkv` |" in values["table"] and values["table"].splitlines()[-1].endswith(
        " | — | not compared |")
    assert leaderboard_page([task_run("b", ("kvzip",))]).values["unranked"] == "none"


def test_the_templates_slots_and_claims_are_the_renderers() -> None:
    """Every slot and claim of the leaderboard paragraphs of docs/leaderboard.md and the README is one the renderers
    give (here on two tiny runs), so a render from the committed runs fills them all, its tables with their tiers and
    rank intervals, and the page's other filter."""
    import re

    import sys

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "analyses"))  # the README's scripts import their modules from beside them
    import readme_numbers
    import slots

    runs = {"evaluate": [task_run("a", ("kvzip",)), task_run("b", ("snapkv",))]}
    for template, name in (("templates/docs/leaderboard.md", "leaderboard"),
                           ("templates/docs/leaderboard.md", "leaderboard-query-aware"),
                           ("templates/README.md", "front-leaderboard")):
        text = (root / template).read_text()
        body = re.search(rf"^<!-- numbers: {name} -->\n(.*?)^<!-- /numbers -->", text, re.M | re.S)[1]
        filled, _ = slots.fill(body, readme_numbers.RENDERERS[name].read(runs), name)
        assert "not yet rendered" not in filled and "| tier |" in filled, name


def test_the_column_says_what_kvpress_lacks_and_the_claim_holds_only_where_every_answer_is_equal(compared) -> None:
    """A press kvpress lacks reads "—" and is not counted among those the prose may call equal; with snapkv's
    unequal answer gone, every press kvpress has is equal in every answer compared, and the claim holds; query-aware
    runs read that loop's comparisons."""
    run = task_run("a", ("kvzip", "snapkv"))
    own = run.examples[run.examples["press"] == "kvzip"].assign(press="lowrank")  # spectra's own: no kvpress peer
    run = TaskRun(run.path, run.meta, pd.concat([run.examples, own], ignore_index=True), run.scores, run.lengths,
                  run.needle, run.evicted)
    rendered = leaderboard_page([run])
    assert next(line for line in rendered.values["table"].splitlines() if "`lowrank`" in line).endswith(" | — |")
    assert rendered.values["kvpress_peers"] == "2" and rendered.claims["every-peer-equal"] is False
    table = pd.read_csv(compared)
    table.loc[(table["press"] == "snapkv") & (table["ratio"] == 0.75), "equal"] = 2
    table.to_csv(compared, index=False)
    rendered = leaderboard_page([run])
    assert rendered.values["equal_to_kvpress"] == "`kvzip`, `snapkv`" and rendered.claims["every-peer-equal"]
    aware = TaskRun(run.path, {**run.meta, "query_aware": True}, run.examples, run.scores, run.lengths, run.needle,
                    run.evicted)
    values = leaderboard_page([aware]).values
    assert next(line for line in values["table"].splitlines() if "`kvzip`" in line).endswith(" | 1/2 |")
    assert values["equal_to_kvpress"] == "none" and values["kvpress_compared"] == "1"
