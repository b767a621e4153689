"""The leaderboard's second-model paragraphs (analyses/readme_models.py) on tiny runs: the bridge's correlations and
budget comparison recounted from the runs' needle.npz and per-example files (through their published folders), the
two-model comparison recounted from both models' per-example files, and blocks that lack a part refused in one
line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

import spectra
from spectra.report import published
from spectra.report.arms import compared, ranked
from spectra.report.models import paired

import task_files

from .conftest import quiet

import readme_models  # noqa: E402  (conftest puts analyses/ on the path)
from readme_values import RenderError  # noqa: E402


def answered_records(path, count: int = 4):
    """Task records answered by the letter e, which most five-token answers of the tiny decoder hold (a random tiny
    model answers no needle; the paragraphs read the questions the full cache answered)."""
    return task_files.write(path, [{**row, "answers": ["e"]} for row in task_files.records(count=count)])


@pytest.fixture(scope="module")
def bridged(chat_decoder, text_file, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bridged")
    analysis = spectra.analyze(str(chat_decoder), str(text_file), length=64, samples=4, batch_size=2,
                               out=root / "analyze", progress=None, notify=quiet)
    run = spectra.evaluate(str(chat_decoder), str(answered_records(root / "tasks.jsonl")), out=root / "tasks",
                           ratios="0.5,0.75", presses=f"snapkv,adakv(snapkv),headbudget({analysis.path}@rank)",
                           progress=None, notify=quiet)
    folders = published.publish([analysis.path, run.path], root / "results")
    return {"run": run, "analysis": analysis, "folders": [spectra.load_run(folder) for folder in folders]}


def test_the_bridge_paragraph_recounts_the_correlations_and_the_budget(bridged, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(readme_models, "FEWEST_HEADS", 2)  # the tiny decoder has 2 layers × 2 key/value heads
    analysis, run = bridged["folders"]
    rendered = readme_models.leaderboard_bridge({"analyze": [analysis], "evaluate": [run]})
    values = rendered.values
    examples = pd.read_csv(bridged["run"].path / "task_examples.csv")
    answered = examples[(examples["press"] == "full") & (examples["score"] == 1)]["example"].to_numpy()
    assert values["heads"] == "4" and values["questions"] == str(len(answered))
    arrays = np.load(bridged["run"].path / "needle.npz")
    metrics = pd.read_csv(bridged["analysis"].path / "metrics.csv")
    rank = metrics["rank90_mean"].to_numpy().reshape(2, 2, 2).mean(-1).ravel()
    where = np.searchsorted(arrays["example"], answered)
    lines, checked = values["rho_table"].splitlines(), 0
    for index, (press, ratio) in enumerate(zip(arrays["press"], arrays["ratio"])):
        line = next((line for line in lines if line.startswith(f"| `{press}` | {ratio:g} |")), None)
        if press == "full" or line is None:
            continue
        survival = arrays["survival"][index][where].mean(axis=0).ravel()
        heads = int(line.split(" | ")[2])
        if heads == 4 and np.ptp(survival) > 0:
            expected = spearmanr(rank, survival).statistic
            header = lines[0].strip("| ").split(" | ")
            column = header.index(readme_models.HEADINGS["rank90"])
            assert line.split(" | ")[column].startswith(f"{expected:+.2f}")
            checked += 1
    assert checked
    scores = examples[examples["example"].isin(answered)].groupby(["press", "ratio"])["score"].mean()
    budget = f"headbudget({bridged['analysis'].path}@rank)"
    assert values["budget"] == f"`{budget}`"
    assert len(values["budget_table"].splitlines()) == 2 + 2  # header, rule, two ratios
    for line in values["budget_table"].splitlines()[2:]:
        cells = line.strip("| ").split(" | ")
        ratio = float(cells[0])
        assert cells[1] == f"{scores.loc[(budget, ratio)]:.2f}"
        assert cells[2] == f"{scores.loc[('adakv(snapkv)', ratio)]:.2f}"
        assert cells[-1].endswith(", the same bytes")
    assert rendered.claims["equal-bytes"] is True
    # another model's task run in the same block (the two-model comparison's) is not read
    other = tmp_path / "other"
    shutil.copytree(bridged["run"].path, other)
    meta = json.loads((other / "run.json").read_text())
    meta["model"]["name"] = "another"
    (other / "run.json").write_text(json.dumps(meta))
    again = readme_models.leaderboard_bridge({"analyze": [analysis], "evaluate": [spectra.load_run(other), run]})
    assert again.values == values
    assert set(rendered.claims) == {"some-correlation-excludes-zero", "no-strong-correlation", "higher-rank-keeps-more",
                                    "adakv-follows-entropy", "budget-below-adakv-at-every-ratio",
                                    "budget-never-beats-adakv", "budget-loses-to-adakv-somewhere", "equal-bytes",
                                    "budget-beats-adakv-somewhere", "budget-beats-adakv-at-the-lowest-ratio",
                                    "too-few-heads-compressed", "adakv-answers-as-uniform"}
    assert rendered.claims["too-few-heads-compressed"] is False and values["compressed"] == "4"


def test_a_bridge_block_without_its_analyze_run_or_budget_is_refused(bridged) -> None:
    analysis, run = bridged["folders"]
    with pytest.raises(RenderError, match="one `spectra analyze`"):
        readme_models.leaderboard_bridge({"evaluate": [run]})
    with pytest.raises(RenderError, match="spectra evaluate"):
        readme_models.leaderboard_bridge({"analyze": [analysis]})


def test_the_models_paragraph_recounts_both_models(chat_decoder, tmp_path) -> None:
    path = answered_records(tmp_path / "tasks.jsonl")
    other = tmp_path / "other-decoder"
    shutil.copytree(chat_decoder, other)
    runs = [spectra.evaluate(str(model), str(path), out=tmp_path / name, presses="knorm,snapkv", ratios="0.5,0.75",
                             progress=None, notify=quiet)
            for name, model in (("first", chat_decoder), ("second", other))]
    rendered = readme_models.leaderboard_models({"evaluate": runs})
    values = rendered.values
    names = [run.meta["model"]["name"] for run in runs]
    assert (values["first"], values["second"]) == tuple(names)
    score = {name: pd.read_csv(run.path / "task_examples.csv").set_index(["press", "ratio", "example"])["score"]
             for name, run in zip(names, runs)}
    lines = values["table"].splitlines()
    assert lines[0] == "| press | r = 0.5 | r = 0.75 |" and len(lines) == 2 + 2
    for line in lines[2:]:
        press = line.split(" | ")[0].strip("| `")
        for column, ratio in ((1, 0.5), (2, 0.75)):
            cell = line.strip("| ").split(" | ")[column]
            mine, theirs = (score[name].loc[(press, ratio)].mean() for name in names)
            assert cell.startswith(f"{mine:.2f} / {theirs:.2f} ({theirs - mine:+.2f}")
    full = score[names[0]].loc[("full", 0.0)].mean()
    assert values["full_first"].startswith(f"{full:.2f} [") and values["presses"] == "2"
    assert set(rendered.claims) == {
        "ranking-related", "ranking-changes", "some-verdicts-flip", "most-verdicts-agree", "same-leader", "same-tail",
        "flips-only-at-lowest-ratio", "random-in-shared-tail", "second-leaders-lead-first",
        "whole-model-passes-hold-only-on-second", "whole-model-passes-lose-on-second-above-lowest",
        "some-lower-on-second", "agreeing-verdicts-all-lose", "none-holds-on-both", "second-removes-fewer-bytes"}
    assert rendered.claims["whole-model-passes-hold-only-on-second"] is False  # none of them ran
    # the bytes each model's presses store, per ratio, from the per-example files
    for name, key in zip(names, ("bytes_first", "bytes_second")):
        shares = pd.read_csv(runs[names.index(name)].path / "task_examples.csv")
        shares = shares[shares["press"] != "full"].groupby("ratio")["bytes_share"].mean()
        assert values[key] == f"{shares.loc[0.5]:.3f} at r = 0.5, {shares.loc[0.75]:.3f} at r = 0.75"
    # the cells whose verdicts agree, and the presses lower on the second model at every ratio
    cells = compared(paired(runs[:1], runs[1:]).rows, 0, tuple(names))
    pressed = cells[cells["press"] != "full"]
    assert values["agree"] == f"{int((~pressed['flips']).sum())} of {len(pressed)}"
    lower = [press for press, mine in pressed.groupby("press", sort=False) if (mine["delta_high"] < 0).all()]
    assert values["lower"] == (", ".join(f"`{press}`" for press in lower) or "none")
    # the first tiers and the shared last tier, read from each model's tiers (arms.ranked, tested in tests/report)
    order = ranked(paired(runs[:1], runs[1:]).rows, 0, tuple(names))[0]
    for arm, key in zip(names, ("top_first", "top_second")):
        assert set(values[key].split(", ")) == {f"`{press}`" for press in order.loc[order[f"{arm}_tier"] == 1, "press"]}
    last = [set(order.loc[order[f"{arm}_tier"] == order[f"{arm}_tier"].max(), "press"]) for arm in names]
    assert set(values["tail"].split(", ")) == {f"`{press}`" for press in last[0] & last[1]}
    assert rendered.claims["random-in-shared-tail"] is False  # kvpress:random did not run

    with pytest.raises(RenderError, match="two models, got 1"):
        readme_models.leaderboard_models({"evaluate": runs[:1]})


def test_cells_left_out_are_named_when_few_and_counted_when_many() -> None:
    few = pd.DataFrame({"press": ["kvgrad", "kvgrad"], "ratio": [0.25, 0.25], "measure": ["c_at", "rank90"],
                        "heads": [1, 1]})
    assert readme_models.left_out(few) == "`kvgrad` at r = 0.25 (1)"
    assert readme_models.left_out(few.iloc[:0]) == "none"
    many = pd.DataFrame({"press": ["a", "a", "b", "b", "c"], "ratio": [0.25, 0.5, 0.25, 0.5, 0.25],
                         "heads": [3, 3, 1, 3, 2]})
    assert readme_models.left_out(many) == "5 cells of 3 presses, 1–3 heads compressed in each"
    assert readme_models.left_out(many.assign(heads=3)) == "5 cells of 3 presses, 3 heads compressed in each"


def test_adakv_is_said_to_answer_as_the_uniform_press_only_where_every_example_agrees() -> None:
    rows = pd.DataFrame({"press": ["adakv(snapkv)"] * 2 + ["kvpress:snapkv"] * 2 + ["snapkv"] * 2,
                         "ratio": [0.5, 0.5] * 3, "example": [0, 1] * 3,
                         "prediction": ["a", "b", "a", "b", "a", "c"], "needle_kept": [1.0, 0.5] * 3})
    assert readme_models.uniform_twin(rows, "adakv(snapkv)", readme_models.UNIFORM) == "`kvpress:snapkv`"
    kept = rows.copy()
    kept.loc[3, "needle_kept"] = 0.25  # the same answers, another share of the needle kept
    assert readme_models.uniform_twin(kept, "adakv(snapkv)", readme_models.UNIFORM) == ""
    assert readme_models.uniform_twin(rows[rows["press"] != "adakv(snapkv)"], "adakv(snapkv)",
                                      readme_models.UNIFORM) == ""


def test_presses_that_answer_alike_on_every_example_are_grouped() -> None:
    rows = pd.DataFrame({"press": ["full"] * 2 + ["a"] * 2 + ["b"] * 2 + ["c"] * 2 + ["d"] * 2,
                         "ratio": [0.0, 0.0] + [0.5, 0.5] * 4, "example": [0, 1] * 5,
                         "prediction": ["x", "y", "x", "y", "x", "y", "x", "z", "q", "z"]})
    assert readme_models.alike(rows) == [["a", "b"]]
    assert readme_models.named_groups(readme_models.alike(rows)) == "`a` = `b`"
    assert readme_models.named_groups([]) == "none"

