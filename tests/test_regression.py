"""Every analysis on a fixed tiny model gives the outputs recorded in tests/golden/, to the tolerances recorded
beside them (see regression.py and tolerances.py).

The comparison always goes through the tolerances, on every machine, this one included: CI runs on another
CPU, and the suite must exercise the path users get. Labels, columns, row order, counts and run.json are
compared exactly; the numbers to tolerances derived from perturbed runs. The same-machine promise that a
refactor changes nothing bitwise is checked with `python tests/regression.py --snapshot/--compare`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pandas as pd
import pytest
import regression
import rows
import tolerances

CASES = sorted(path.name for path in regression.GOLDEN.iterdir() if path.is_dir())


@pytest.fixture(scope="module")
def produced(tmp_path_factory, one_thread) -> regression.Outputs:
    return regression.make(tmp_path_factory.mktemp("regression"))


def test_every_case_has_its_tolerances() -> None:
    named = regression.cases(regression.Inputs("model", "corpus", "decoder", "tasks"))
    assert set(CASES) == set(named), "regenerate: python tests/regression.py"
    for case in CASES:
        spec = json.loads((regression.GOLDEN / case / tolerances.FILE).read_text())
        assert sorted(spec["files"]) == sorted(regression.read(regression.GOLDEN)[case]), case


@pytest.mark.parametrize("case", CASES)
def test_outputs_equal_the_baseline_to_its_tolerances(case: str, produced) -> None:
    spec = json.loads((regression.GOLDEN / case / tolerances.FILE).read_text())
    problems = tolerances.check(produced[case], regression.read(regression.GOLDEN)[case], spec)
    assert not problems, f"{case} differs from tests/golden:\n" + "\n".join(problems)


def _frame(files: regression.Outputs | dict[str, bytes], name: str) -> pd.DataFrame:
    return pd.read_csv(io.BytesIO(files[name]))


def _edited(case: str, name: str, edit: Callable[[pd.DataFrame], pd.DataFrame]
            ) -> tuple[dict[str, bytes], dict[str, bytes], dict]:
    """A copy of `case`'s stored baseline with its table `name` replaced by `edit(table)`, the baseline, and its
    tolerances: the arguments of `tolerances.check`."""
    want = regression.read(regression.GOLDEN)[case]
    got = {**want, name: edit(_frame(want, name)).to_csv(index=False).encode()}
    return got, want, json.loads((regression.GOLDEN / case / tolerances.FILE).read_text())


def _cell(column: str, row: int, change: Callable[[object], object]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def edit(frame: pd.DataFrame) -> pd.DataFrame:
        frame.loc[row, column] = change(frame.loc[row, column])
        return frame

    return edit


def test_the_comparison_catches_what_rounding_cannot_explain() -> None:
    """Unchanged files pass, and so does a mean moved by rounding; a mean moved by 1e-4 relative (far beyond svd's
    tolerance), a relabelled row, reordered rows and a flipped success rate in a cell the perturbations never moved
    are reported, with the file, column and row."""
    case, name, row = "approx-all", "heads.csv", 3  # row 3: svd, budget 4, layer 0, head 1, out_err
    assert tolerances.check(*_edited(case, name, lambda frame: frame)) == []
    assert tolerances.check(*_edited(case, name, _cell("mean", row, lambda x: x * (1 + 1e-7)))) == []
    moved = tolerances.check(*_edited(case, name, _cell("mean", row, lambda x: x * (1 + 1e-4))))
    assert len(moved) == 1 and "heads.csv:mean at method=svd budget=4 layer=0 head=1 metric=out_err" in moved[0]
    relabelled = tolerances.check(*_edited(case, name, _cell("method", row, lambda label: "jl")))
    assert relabelled == ["heads.csv:method differs (compared exactly: labels, indices and counts)"]
    reordered = tolerances.check(*_edited(case, name, lambda frame: frame.iloc[::-1].reset_index(drop=True)))
    assert "heads.csv:method differs (compared exactly: labels, indices and counts)" in reordered
    _, want, spec = _edited(case, name, lambda frame: frame)
    never = next(i for i in range(len(_frame(want, name)))
                 if str(i) not in spec["files"][name]["columns"]["pr_below_target"]["cells"])
    flipped = tolerances.check(*_edited(case, name, _cell("pr_below_target", never, lambda x: x + 1 / 6)))
    assert len(flipped) == 1 and flipped[0].startswith("heads.csv:pr_below_target")


def test_a_column_without_a_tolerance_is_reported() -> None:
    got, want, spec = _edited("analyze-pack", "metrics.csv", lambda frame: frame)
    del spec["files"]["metrics.csv"]["columns"]["sink_mean"]
    problems = tolerances.check(got, want, spec)
    assert len(problems) == 1 and "covers" in problems[0] and problems[0].endswith("regenerate it")


def test_discrete_outcomes_get_rules_derived_from_the_runs_that_moved_them() -> None:
    """A greedy answer that flips in a perturbed run makes its cell free (text: flips; a score or a count: cells),
    and a table row that an outcome removes becomes optional; the perturbed outputs then pass, unchanged cells do
    not move."""
    def csv(rows: list[dict], columns: list[str]) -> bytes:
        return pd.DataFrame(rows, columns=columns).to_csv(index=False).encode()

    examples, evicted = ["press", "example", "prediction", "score", "failed"], ["press", "example", "score"]
    base = {"task_examples.csv": csv([{"press": "knorm", "example": 0, "prediction": "a b", "score": 1.0, "failed": 0},
                                      {"press": "knorm", "example": 1, "prediction": "c", "score": 0.0, "failed": 1}],
                                     examples),
            "task_evicted.csv": csv([{"press": "knorm", "example": 1, "score": 0.0}], evicted)}
    flipped = {"task_examples.csv": csv([{"press": "knorm", "example": 0, "prediction": "a b", "score": 1.0,
                                          "failed": 0},
                                         {"press": "knorm", "example": 1, "prediction": "a", "score": 0.5,
                                          "failed": 2}], examples),
               "task_evicted.csv": csv([], evicted)}
    spec = tolerances.derive(base, [base, flipped], regression.AMPLITUDE)
    columns = spec["files"]["task_examples.csv"]["columns"]
    assert columns["press, example"]["rule"] == "exact"
    assert columns["prediction"]["rule"] == "flips" and columns["prediction"]["cells"] == [1]
    assert columns["score"]["cells"] == {"1": 5.0} and columns["failed"]["cells"] == {"1": 10.0}
    assert spec["files"]["task_evicted.csv"]["rows"]["optional"] == ["'knorm'|1"]
    assert tolerances.check(flipped, base, spec) == [] and tolerances.check(base, base, spec) == []
    other = {**flipped, "task_examples.csv": flipped["task_examples.csv"].replace(b"a b", b"a c")}
    assert tolerances.check(other, base, spec) == ["task_examples.csv:prediction at press=knorm example=0 "
                                                   "prediction=a b failed=0: 1 cells differ where the perturbations "
                                                   "changed none"]


def test_a_greedy_answer_may_differ_only_where_the_perturbations_changed_one() -> None:
    """tasks: another prediction or score in a cell the perturbed runs flipped passes; in a cell they never
    changed, it is reported."""
    case, name = "tasks", "task_examples.csv"
    _, want, spec = _edited(case, name, lambda frame: frame)
    rules, count = spec["files"][name]["columns"], len(_frame(want, name))
    flipped, moved = rules["prediction"]["cells"], [int(cell) for cell in rules["score"]["cells"]]
    assert flipped and moved, "the perturbations flip some of the tiny decoder's greedy answers"
    assert tolerances.check(*_edited(case, name, _cell("prediction", flipped[0], lambda text: text + " x"))) == []
    assert tolerances.check(*_edited(case, name, _cell("score", moved[0], lambda x: 1 - x))) == []
    never = next(i for i in range(count) if i not in flipped)
    problems = tolerances.check(*_edited(case, name, _cell("prediction", never, lambda text: text + " x")))
    assert len(problems) == 1 and problems[0].startswith("task_examples.csv:prediction at press=")
    steady = next(i for i in range(count) if i not in moved)
    problems = tolerances.check(*_edited(case, name, _cell("score", steady, lambda x: x + 0.5)))
    assert len(problems) == 1 and problems[0].startswith("task_examples.csv:score at press=")


def test_rows_come_and_go_only_where_the_perturbations_showed_it() -> None:
    """task_evicted.csv: a row that some perturbed run lacked may be missing; any other missing, extra or
    reordered row is reported."""
    case, name = "tasks", "task_evicted.csv"
    _, want, spec = _edited(case, name, lambda frame: frame)
    rule, frame = spec["files"][name]["rows"], _frame(want, name)
    names = rows.row_names({column: frame[column].to_numpy() for column in frame.columns})
    optional = [i for i, row in enumerate(names) if row in rule["optional"]]
    required = [i for i, row in enumerate(names) if row not in rule["optional"]]
    assert optional and len(required) >= 2, "the tiny task run has rows of both kinds"
    assert tolerances.check(*_edited(case, name, lambda table: table.drop(index=optional[0]))) == []
    missing = tolerances.check(*_edited(case, name, lambda table: table.drop(index=required[0])))
    assert len(missing) == 1 and f"rows {names[required[0]]} are missing" in missing[0]
    extra = tolerances.check(*_edited(case, name, lambda table: pd.concat(
        [table, table.iloc[[required[0]]].assign(example=99)], ignore_index=True)))
    assert len(extra) == 1 and "are extra" in extra[0]
    swapped = tolerances.check(*_edited(case, name, lambda table: table.iloc[required[::-1] + optional]
                                        .reset_index(drop=True)))
    assert swapped == [f"{name}: the rows {rule['key']} are in another order than the baseline's"]


def test_a_press_whose_tie_breaks_by_rounding_does_not_loosen_the_others() -> None:
    """cache-presses: knorm (equal key norms of a repeated token, broken by rounding) gets its own wide tolerance;
    snapkv's NLL moved by 1e-4 relative is still reported."""
    case, name = "cache-presses", "cache.csv"
    _, want, spec = _edited(case, name, lambda frame: frame)
    groups, frame = spec["files"][name]["columns"]["nll"]["groups"], _frame(want, name)
    assert groups["knorm"]["atol"] > 1e-3 > groups["snapkv"]["atol"] + groups["snapkv"]["rtol"] * 10
    knorm, snapkv = (int(frame.index[frame["press"] == press][0]) for press in ("knorm", "snapkv"))
    assert tolerances.check(*_edited(case, name, _cell("nll", knorm, lambda x: x * (1 + 1e-4)))) == []
    problems = tolerances.check(*_edited(case, name, _cell("nll", snapkv, lambda x: x * (1 + 1e-4))))
    assert len(problems) == 1 and problems[0].startswith("cache.csv:nll at press=snapkv")
