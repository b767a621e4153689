"""The leaderboard's haystack paragraph (analyses/readme_boards.py) on two tiny task runs of the same needles, one
file marked as noise and one as prose: its values are recounted from the runs' own per-example files, and a block
without both arms is refused in one line."""

from __future__ import annotations

import pandas as pd
import pytest

import spectra

import task_files

from .conftest import haystack_arms, quiet

import readme_boards  # noqa: E402  (conftest puts analyses/ on the path)
from readme_values import RenderError  # noqa: E402


@pytest.fixture(scope="module")
def arms(chat_decoder, tmp_path_factory) -> dict:
    found = haystack_arms(chat_decoder, tmp_path_factory.mktemp("arms"), "0.5,0.75")
    return {arm: spectra.load_run(run.path) for arm, run in found.items()}


def test_the_paragraph_recounts_both_arms_from_their_examples(arms) -> None:
    rendered = readme_boards.leaderboard_haystacks({"evaluate": [arms["prose"], arms["noise"]]})
    examples = {arm: pd.read_csv(run.path / "task_examples.csv") for arm, run in arms.items()}
    values = rendered.values
    assert values["examples"] == "4" and values["cells"] == "4" and values["tasks"] == "`passkey`"
    full = {arm: table[table["press"] == "full"]["score"].mean() for arm, table in examples.items()}
    assert values["full_noise"].startswith(f"{full['noise']:.2f} [")
    assert values["full_prose"].startswith(f"{full['prose']:.2f} [")
    snap = {arm: table[table["press"] == "snapkv"]["score"].mean() for arm, table in examples.items()}
    assert values["reference_noise"] == f"{snap['noise']:.2f}" and values["reference_prose"] == f"{snap['prose']:.2f}"
    lines = values["table"].splitlines()
    assert lines[0] == "| press | r = 0.5 | r = 0.75 |" and len(lines) == 2 + 3  # header, rule, full and two presses
    knorm = examples["noise"].query("press == 'knorm' and ratio == 0.5")["score"].mean()
    after = examples["prose"].query("press == 'knorm' and ratio == 0.5")["score"].mean()
    assert next(line for line in lines if "`knorm`" in line).split(" | ")[1].startswith(f"{knorm:.2f} → {after:.2f} (")
    assert int(values["lower_on_prose"]) + int(values["higher_on_prose"]) <= 4
    assert values["flattered"] == "none" and rendered.claims["noise-flatters-unusual-keys"] is False
    assert set(rendered.claims) == {"ranking-changes", "ranking-related", "reference-low-on-both",
                                    "noise-flatters-unusual-keys", "more-cells-lower-on-prose"}


def test_a_block_without_both_haystacks_is_refused(arms) -> None:
    with pytest.raises(RenderError, match="--haystack noise"):
        readme_boards.leaderboard_haystacks({"evaluate": [arms["prose"]]})
    with pytest.raises(RenderError, match="spectra evaluate"):
        readme_boards.leaderboard_haystacks({})


def test_the_question_drop_paragraph_recounts_both_runs(chat_decoder, tmp_path) -> None:
    """In view / once per press and ratio, read from the two runs' per-example files question by question, the
    largest drop and the claims on it."""
    path = task_files.write(tmp_path / "many.jsonl", task_files.many_questions(task_files.records(count=3)))
    settings = dict(presses="knorm,snapkv", ratios="0.5", progress=None, notify=quiet)
    aware = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "aware", query_aware=True, **settings)
    once = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "once", **settings)
    runs = [spectra.load_run(run.path) for run in (once, aware)]
    rendered = readme_boards.leaderboard_in_view({"evaluate": runs})
    keys = ["press", "ratio", "example", "question"]
    mine = pd.read_csv(aware.path / "task_examples.csv").set_index(keys)["score"]
    theirs = pd.read_csv(once.path / "task_examples.csv").set_index(keys)["score"]
    values = rendered.values
    assert values["records"] == "3" and values["questions"] == "6"
    assert values["full_in_view"] == f"{mine.loc[('full', 0.0)].mean():.2f}"
    assert values["full_once"] == f"{theirs.loc[('full', 0.0)].mean():.2f}"
    row = next(line for line in values["table"].splitlines() if "`snapkv`" in line)
    drop = (mine - theirs).loc[("snapkv", 0.5)].mean()
    assert row.split(" | ")[1].startswith(f"{mine.loc[('snapkv', 0.5)].mean():.2f} / "
                                          f"{theirs.loc[('snapkv', 0.5)].mean():.2f} ({drop:+.2f} [")
    drops = {press: (mine - theirs).loc[(press, 0.5)].mean() for press in ("knorm", "snapkv")}
    worst = max(drops, key=drops.get)
    assert values["largest_drop"].startswith(f"{drops[worst]:+.2f} [") and values["largest_at"] == f"`{worst}` at r = 0.5"
    assert rendered.claims["once-costs-little"] == (drops[worst] < readme_boards.SMALL)
    assert rendered.claims["reference-gains-little-in-view"] == (drops["snapkv"] < readme_boards.SMALL)
    assert rendered.claims["some-better-once"] == (values["better_once"] != "none")
    with pytest.raises(RenderError, match="--query-aware and not"):
        readme_boards.leaderboard_in_view({"evaluate": runs[:1]})
