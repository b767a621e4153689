"""The leaderboard pools task runs of one task file and ranks presses over the tasks the full cache holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectra.errors import SpectraError
from spectra.report.evaluate import TaskRun
from spectra.report.leaderboard import answered_rows, draw, held, pooled, ranking, standings

RATIOS = (0.25, 0.5, 0.75)


def run(name: str, scores: dict[str, list[list[float]]], sha: str = "s", full_answer: str = "42") -> TaskRun:
    """A task run of 8 records (tasks `held` 0–3 and `lost` 4–7; the full cache answers `held` and half of `lost`);
    `scores[press]` gives per ratio the 8 examples' scores."""
    rows = [{"press": "full", "ratio": 0.0, "example": example, "question": 0,
             "task": "held" if example < 4 else "lost", "prediction": full_answer if example < 6 else "no",
             "score": 1.0 if example < 6 else 0.0, "bytes_share": 1.0} for example in range(8)]
    rows += [{"press": press, "ratio": ratio, "example": example, "question": 0,
              "task": "held" if example < 4 else "lost", "prediction": "x", "score": float(value),
              "bytes_share": 1 - ratio}
             for press, per_ratio in scores.items() for ratio, values in zip(RATIOS, per_ratio)
             for example, value in enumerate(values)]
    meta = {"data": {"sha256": sha, "name": "t.jsonl"}, "settings": {"seed": 0}, "model": {"name": "tiny"}}
    return TaskRun(Path("/runs") / name, meta, pd.DataFrame(rows), *[pd.DataFrame()] * 4)


GOOD = [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 1, 1, 1, 1]]
BAD = [[1, 1, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]]


def test_runs_pool_into_one_table_of_the_held_tasks_ranked_by_their_mean_over_ratios() -> None:
    examples = pooled([run("a", {"good": GOOD}), run("b", {"bad": BAD})])
    assert (examples["press"] == "full").sum() == 8  # the full cache's rows once
    assert held(examples) == (["held"], {"lost": 0.5})
    table = standings(examples, seed=0).set_index(["press", "ratio"])
    # the held task's examples only (0–3): the plain mean of their scores, the full cache's beside it
    for press, per_ratio in (("good", GOOD), ("bad", BAD)):
        for ratio, values in zip(RATIOS, per_ratio):
            assert table.loc[(press, ratio), "score"] == pytest.approx(np.mean(values[:4]))
            assert table.loc[(press, ratio), "examples"] == 4
            assert table.loc[(press, ratio), "full"] == 1.0
            assert table.loc[(press, ratio), "low"] <= table.loc[(press, ratio), "score"] <= \
                table.loc[(press, ratio), "high"]
    order = ranking(examples, seed=0)
    assert list(order["press"]) == ["full", "good", "bad"] and list(order["rank"]) == [0, 1, 2]
    means = order.set_index("press")["score"]
    # every ratio ran the same examples: the mean over ratios is the mean of the cells' means
    assert means["good"] == pytest.approx(np.mean([np.mean(values[:4]) for values in GOOD]))
    assert means["bad"] == pytest.approx(np.mean([np.mean(values[:4]) for values in BAD]))
    assert order.set_index("press").loc["good", "ratios"] == 3
    assert order.set_index("press").loc["good", "delta"] == pytest.approx(means["good"] - 1.0)


def test_tied_presses_share_a_rank() -> None:
    order = ranking(pooled([run("a", {"one": GOOD, "two": GOOD})]), seed=0)
    assert list(order["rank"]) == [0, 1, 1]


@pytest.mark.parametrize("second, message", [
    (run("b", {"bad": BAD}, sha="other"), "differ in their task file"),
    (run("b", {"bad": BAD}, full_answer="41"), "answered otherwise"),
    (run("b", {"good": GOOD}), "good at ratio 0.25 is in"),
])
def test_runs_that_cannot_be_pooled_are_refused_in_one_line(second: TaskRun, message: str) -> None:
    with pytest.raises(SpectraError, match=message):
        pooled([run("a", {"good": GOOD}), second])


def without(task_run: TaskRun, examples: range) -> TaskRun:
    """`task_run` with the rows of `examples` left out (a run of fewer samples)."""
    kept = task_run.examples[~task_run.examples["example"].isin(examples)]
    return TaskRun(task_run.path, task_run.meta, kept.reset_index(drop=True), *[pd.DataFrame()] * 4)


def test_runs_of_other_examples_are_named_as_such_and_not_as_a_decoding_difference() -> None:
    """Issue 55: runs that cover different examples, answering alike on the ones they share, were said to decode
    otherwise ("another spectra version or --dtype?") and were both named 'tiny · t.jsonl'."""
    first, second = run("a", {"good": GOOD}), without(run("b", {"bad": BAD}), range(4, 8))
    with pytest.raises(SpectraError) as caught:
        pooled([first, second])
    message = str(caught.value)
    assert message.startswith("/runs/b lacks examples 4–7 that /runs/a has: ") and "decode" not in message
    with pytest.raises(SpectraError, match="^/runs/a has examples 4–7 that /runs/b lacks: "):
        pooled([second, first])
    with pytest.raises(SpectraError, match="^/runs/b has examples 8–9 that /runs/a lacks and lacks examples 1, 3 "):
        more = run("b", {"bad": BAD})
        extra = more.examples[more.examples["example"] < 2].assign(example=lambda rows: rows["example"] + 8)
        more = TaskRun(more.path, more.meta, pd.concat([more.examples, extra]), *[pd.DataFrame()] * 4)
        pooled([first, without(more, (1, 3))])
    # the full cache answering otherwise on a shared example is still a decoding difference, counted over the
    # shared examples only and naming both runs' directories
    other = without(run("b", {"bad": BAD}, full_answer="41"), range(4, 8))
    with pytest.raises(SpectraError, match=r"^the full cache of /runs/b answered otherwise than /runs/a's on 4 of "
                                           r"the 4 examples they share \(example 0, question 0: '41' vs '42'\)"):
        pooled([first, other])


def test_a_press_that_ran_other_ratios_or_fewer_examples_is_refused_naming_its_run() -> None:
    """Issue 55: a press measured at r = 0.5 only was ranked on its mean beside presses measured at 0.25, 0.5 and
    0.75 (its other cells blank), exit 0. Pooling refuses it: its mean over r would average other ratios."""
    half = run("b", {"bad": BAD})
    half = TaskRun(half.path, half.meta, half.examples[half.examples["ratio"].isin([0.0, 0.5])], *[pd.DataFrame()] * 4)
    with pytest.raises(SpectraError,
                       match=r"^/runs/b ran bad at ratios 0.5 and /runs/a ran good at ratios 0.25, 0.5, 0.75: "):
        pooled([run("a", {"good": GOOD}), half])
    # one press split over two runs, each run a ratio, pools as one press at every ratio
    split = [run("a", {"good": GOOD, "bad": BAD}), run("b", {"other": GOOD})]
    one = split[1].examples
    parts = [TaskRun(Path(f"/runs/{ratio}"), split[1].meta, one[one["ratio"].isin([0.0, ratio])],
                     *[pd.DataFrame()] * 4) for ratio in RATIOS]
    assert len(pooled([split[0], *parts])) == len(pooled(split))
    short = run("b", {"bad": BAD})
    rows = short.examples
    short = TaskRun(short.path, short.meta, rows[~((rows["press"] == "bad") & (rows["ratio"] == 0.75)
                                                  & (rows["example"] == 5))], *[pd.DataFrame()] * 4)
    with pytest.raises(SpectraError, match="^bad at ratio 0.75 in /runs/b lacks examples 5 that its full cache"):
        pooled([run("a", {"good": GOOD}), short])


def test_over_the_answered_questions_a_press_scores_the_share_it_keeps() -> None:
    """Where no task holds as a whole, presses are judged on the questions the full cache answers (examples 0–5
    here, of both tasks): a press's score there is the share of those answers it keeps, the full cache's 1."""
    examples = pooled([run("a", {"good": GOOD, "bad": BAD})])
    assert sorted(answered_rows(examples)["example"].unique()) == [0, 1, 2, 3, 4, 5]
    table = standings(examples, seed=0, over="answered").set_index(["press", "ratio"])
    assert table.loc[("full", 0.0), "score"] == 1.0
    for press, per_ratio in (("good", GOOD), ("bad", BAD)):
        for ratio, values in zip(RATIOS, per_ratio):
            assert table.loc[(press, ratio), "score"] == pytest.approx(np.mean(values[:6]))
            assert table.loc[(press, ratio), "examples"] == 6
    order = ranking(examples, seed=0, over="answered").set_index("press")
    assert order.loc["good", "score"] == pytest.approx(np.mean([np.mean(values[:6]) for values in GOOD]))
    assert order.loc["bad", "score"] == pytest.approx(np.mean([np.mean(values[:6]) for values in BAD]))
    many = examples.assign(question=examples["example"] % 2, example=examples["example"] // 2)  # 4 records × 2
    kept = answered_rows(many)
    assert sorted(map(tuple, kept[kept["press"] == "full"][["example", "question"]].to_numpy())) == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)], "a record's questions are judged one by one"
    with pytest.raises(SpectraError, match="answers no question"):
        answered_rows(examples.assign(score=0.0))
    with pytest.raises(ValueError, match="'held', 'answered', 'all'"):
        standings(examples, seed=0, over="some")


def test_no_held_task_is_refused() -> None:
    examples = pooled([run("a", {"good": GOOD})])
    with pytest.raises(SpectraError, match="answers no task"):
        ranking(examples, seed=0, holds=1.01)


def test_the_picture_writes_each_cell_in_rank_order(tmp_path) -> None:
    examples = pooled([run("a", {"good": GOOD}), run("b", {"bad": BAD})])
    order = ranking(examples, seed=0)
    figure = draw(standings(examples, seed=0), order, "tiny")
    ax = figure.axes[0]
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert labels == ["full", "1. good", "2. bad"]
    written = [text.get_text() for text in ax.texts]
    assert len(written) == 3 * (len(RATIOS) + 1)
    assert written[4:8] == [f"{np.mean(values[:4]):.2f}" for values in GOOD] + [f"{order['score'][1]:.2f}"]
    figure.savefig(tmp_path / "board.png")


def test_runs_of_a_few_presses_each_pool_into_what_one_run_of_them_all_gives(chat_decoder, tmp_path) -> None:
    """Real runs on a tiny decoder: streaming and knorm in two runs, pooled, rank and score as one run of both."""
    import spectra
    import task_files

    data = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=4))
    quiet = dict(ratios="0.5,0.75", progress=None, notify=lambda line: None)
    both = spectra.cache(str(chat_decoder), str(data), presses="streaming,knorm", out=tmp_path / "both", **quiet)
    parts = [spectra.cache(str(chat_decoder), str(data), presses=press, out=tmp_path / press, **quiet)
             for press in ("streaming", "knorm")]
    columns = ["press", "ratio", "example", "question", "prediction", "score"]
    one = pooled([both])[columns].sort_values(columns[:4]).reset_index(drop=True)
    two = pooled(parts)[columns].sort_values(columns[:4]).reset_index(drop=True)
    pd.testing.assert_frame_equal(one, two)
    seed = 0
    holds = 0.0  # the tiny decoder answers what it answers: every task counts
    pd.testing.assert_frame_equal(standings(pooled([both]), seed, holds).sort_values(["press", "ratio"])
                                  .reset_index(drop=True),
                                  standings(pooled(parts), seed, holds).sort_values(["press", "ratio"])
                                  .reset_index(drop=True))
    pd.testing.assert_frame_equal(ranking(pooled([both]), seed, holds), ranking(pooled(parts), seed, holds))


def test_a_press_that_did_not_compress_as_far_as_r_asks_is_listed_after_the_ranked_without_a_rank() -> None:
    # "lazy" answers best but stores the whole cache at every ratio (simlayerkv at kvpress's defaults on a short
    # context); "half" stores 1 − r/2 (think's key channels); "tight" stores less than 1 − r (kivi2's bits)
    examples = pooled([run("a", {"good": GOOD, "bad": BAD, "lazy": [[1] * 8] * 3, "half": GOOD, "tight": BAD})])
    stored = {"lazy": lambda ratio: 1.0, "half": lambda ratio: 1 - ratio / 2, "tight": lambda ratio: 0.1}
    for press, share in stored.items():
        rows = examples["press"] == press
        examples.loc[rows, "bytes_share"] = examples.loc[rows, "ratio"].map(share)
    order = ranking(examples, seed=0)
    assert list(order["press"]) == ["full", "good", "bad", "tight", "lazy", "half"]
    assert order["rank"].tolist()[:4] == [0, 1, 2, 2] and order["rank"].iloc[4:].isna().all()
    assert order.set_index("press")["reached"].to_dict() == {"full": True, "good": True, "bad": True, "tight": True,
                                                             "lazy": False, "half": False}
    # within the tolerance of a whole number of tokens: 1 − r + 0.005 still counts as compressed to r
    examples.loc[examples["press"] == "half", "bytes_share"] = 1 - examples.loc[examples["press"] == "half",
                                                                                "ratio"] + 0.005
    assert ranking(examples, seed=0).set_index("press").loc["half", "rank"] == 1


def board(presses: dict[str, list[float]], tasks: int = 2, per_task: int = 30) -> pd.DataFrame:
    """Pooled rows of `tasks` tasks of `per_task` examples, the full cache answering every one, each press answering
    the first share of each task's examples `presses[press]` gives, at every ratio alike."""
    rows = []
    for press, shares in {"full": [1.0], **presses}.items():
        for ratio in ([0.0] if press == "full" else RATIOS):
            for task in range(tasks):
                for i in range(per_task):
                    share = shares[task % len(shares)]
                    rows.append({"press": press, "ratio": ratio, "example": task * per_task + i, "question": 0,
                                 "task": f"t{task}", "prediction": "a", "score": float(i < round(share * per_task)),
                                 "bytes_share": 1.0 if press == "full" else 1 - ratio})
    return pd.DataFrame(rows)


def test_the_ranking_gives_each_press_a_rank_interval_and_a_tier_a_test_separates() -> None:
    """Issue 51: ranks came from point estimates only. Two presses with the same scores share their rank, rank
    interval and tier; presses 0.3 apart on 60 examples are told apart; 'close' (one example behind 'top' in each
    task) is not, so it shares the top tier."""
    examples = board({"top": [0.9], "twin": [0.9], "close": [0.9 - 1 / 30], "low": [0.5], "none": [0.0]})
    order = ranking(examples, seed=0).set_index("press")
    assert order.loc["full", "tier"] == 0
    assert order.loc[["top", "twin", "close", "low", "none"], "rank"].tolist() == [1, 1, 3, 4, 5]
    assert order.loc[["top", "twin", "close", "low", "none"], "tier"].tolist() == [1, 1, 1, 2, 3]
    assert (order.loc["top", "rank_low"], order.loc["top", "rank_high"]) == (order.loc["twin", "rank_low"],
                                                                           order.loc["twin", "rank_high"])
    assert order.loc["top", "rank_low"] == 1 and order.loc["close", "rank_high"] == 3
    assert (order.loc["low", "rank_low"], order.loc["low", "rank_high"]) == (4, 4)
    for press in ("top", "close", "low", "none"):
        assert order.loc[press, "rank_low"] <= order.loc[press, "rank"] <= order.loc[press, "rank_high"]
    # a press that did not compress as far as r asks has no rank, rank interval nor tier
    lazy = board({"top": [0.9], "lazy": [1.0]}).assign(bytes_share=1.0)
    assert ranking(lazy, seed=0).set_index("press").loc["lazy", ["rank", "rank_low", "rank_high", "tier"]].isna().all()
    again = ranking(examples, seed=0)
    pd.testing.assert_frame_equal(again, ranking(examples, seed=0))  # bitwise, from the run's seed
    assert not ranking(examples, seed=1)[["low", "high"]].equals(again[["low", "high"]])


def test_a_cell_whose_examples_all_agree_gets_clopper_pearsons_bounds() -> None:
    """Issue 51: a cell where every example scored 0 (or 1) read 0.00 [0.00–0.00], as certain as a census."""
    from scipy.stats import binomtest

    table = standings(board({"none": [0.0], "all": [1.0], "some": [0.5]}), seed=0).set_index(["press", "ratio"])
    never, always = (binomtest(count, 60).proportion_ci(0.95, method="exact") for count in (0, 60))
    assert (table.loc[("none", 0.5), "low"], table.loc[("none", 0.5), "high"]) == pytest.approx((0.0, never.high))
    assert (table.loc[("all", 0.5), "low"], table.loc[("all", 0.5), "high"]) == pytest.approx((always.low, 1.0))
    assert (table.loc[("full", 0.0), "low"], table.loc[("full", 0.0), "high"]) == pytest.approx((always.low, 1.0))
    # `all` answers as the full cache on every example: its difference is bounded as 0 discordant pairs of 60
    assert (table.loc[("all", 0.5), "delta_low"], table.loc[("all", 0.5), "delta_high"]) == pytest.approx(
        (-never.high, never.high))
    assert table.loc[("some", 0.5), "high"] - table.loc[("some", 0.5), "low"] > 0.2


def test_the_filters_are_every_example_the_held_tasks_and_the_answered_ones() -> None:
    examples = pooled([run("a", {"good": GOOD})])
    assert standings(examples, seed=0, over="all").set_index("press").loc["full", "examples"] == 8
    assert standings(examples, seed=0, over="all").set_index(["press", "ratio"]).loc[("good", 0.25), "score"] == \
        pytest.approx(np.mean(GOOD[0]))  # all 8 examples, both tasks
    assert standings(examples, seed=0, over="held").set_index(["press", "ratio"]).loc[("good", 0.25), "score"] == \
        pytest.approx(np.mean(GOOD[0][:4]))
