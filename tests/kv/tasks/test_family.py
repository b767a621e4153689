"""A task family is one declaration: every registered family states what the tasks need (patterns, tokens, metric,
numbers), registration refuses a family that contradicts the rules, task names find their family, the size search
agrees with a scan, and listing the tasks imports no torch."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from spectra.errors import SpectraError
from spectra.registry import TASKS
from spectra.kv.tasks.family import (
    METRICS,
    Family,
    Target,
    example_rng,
    families,
    family_of,
    generated,
    haystack_tasks,
    largest_fitting,
    listing,
    register,
)
from spectra.kv.tasks.haystack import Haystack


def test_every_family_declares_what_its_tasks_need() -> None:
    assert families()[:6] == ("niah", "vt", "cwe", "fwe", "passkey", "qa")  # a new family comes after them
    numbers = [TASKS.facts(task)["number"] for task in TASKS]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)  # listed by number, each once
    for task in TASKS:
        family = TASKS[task]
        assert isinstance(family, Family) and TASKS.facts(task)["family"] == family.name
        assert task == family.name or task.startswith(family.name + "_")
        assert family.max_new_tokens >= 1 and family.metric in METRICS
        assert (family.question_pattern is None) == (family.answer_pattern is None)
        assert TASKS.facts(task)["generated"] == family.generated


def test_the_generated_tasks_keep_their_numbers() -> None:
    """A task's number enters its seeds: the task files written before families had files keep their draws."""
    assert generated()[:12] == ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
                                "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe",
                                "fwe", "passkey")
    assert [TASKS.facts(task)["number"] for task in generated()[:12]] == list(range(12))
    assert haystack_tasks()[:5] == ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue",
                                    "niah_multiquery")


def test_each_task_declares_the_haystack_ruler_gives_it() -> None:
    """RULER's synthetic.yaml `type_haystack` per task (noise for niah_single_1 and vt, essay for the essay tasks,
    needle for niah_multikey_2/3, none for cwe and fwe); passkey hides its key in the same noise, kv_retrieval in a
    JSON object, spectra's own niah_multi_questions in noise. The essay tasks are those that read --haystack."""
    ruler = {"niah_single_1": "noise", "niah_single_2": "essay", "niah_single_3": "essay", "niah_multikey_1": "essay",
             "niah_multikey_2": "needle", "niah_multikey_3": "needle", "niah_multivalue": "essay",
             "niah_multiquery": "essay", "vt": "noise", "cwe": None, "fwe": None, "qa_1": None, "qa_2": None,
             "passkey": "noise", "niah_multiquery_questions": "essay", "niah_multi_questions": "noise",
             "kv_retrieval": None}
    assert set(ruler) == set(TASKS.entries())
    assert {task: TASKS[task].haystack_type(task) for task in ruler} == ruler
    assert haystack_tasks() == tuple(task for task in generated() if ruler[task] == "essay")


def test_task_names_find_their_family() -> None:
    assert family_of("niah_single_2") is TASKS["niah_single_1"]
    assert family_of("niah_custom") is TASKS["niah_single_1"]  # a hand-written record's own niah task
    assert family_of("qa_squad") is TASKS["qa_1"] and family_of("passkey") is TASKS["passkey"]
    assert family_of("sudoku") is None and family_of("vtx") is None


def test_listing_writes_numbered_tasks_once() -> None:
    assert listing(generated()[:12]) == ("niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery, "
                                         "vt, cwe, fwe, passkey")
    assert listing(("qa_1", "qa_2", "x_1", "x_y")) == "qa_1/2, x_1, x_y"


def test_every_generated_task_builds_the_same_example_from_the_same_draws() -> None:
    target = Target(1024, Haystack.noise(), 0, lambda text: len(text.split()))
    for task in generated():
        build = TASKS[task].builder(task, target)
        size = TASKS[task].minimum(task) + 30
        first = build(random.Random(5), size, 0.5)
        assert first == build(random.Random(5), size, 0.5) != build(random.Random(6), size, 0.5)
        assert all(answer in first.context for answer in first.answers), task
    assert example_rng(0, 3, 1024, 2).random() == example_rng(0, 3, 1024, 2).random() != \
        example_rng(0, 4, 1024, 2).random()


class Toy(Family):
    name = "toy"
    tasks = {"toy_1": 900}
    max_new_tokens = 4


def test_registration_refuses_a_family_that_breaks_the_rules(monkeypatch) -> None:
    entries = dict(TASKS._added)
    monkeypatch.setattr(TASKS, "_added", entries)
    monkeypatch.setattr(TASKS, "_objects", dict(TASKS._objects))
    wrong = type("Wrong", (Toy,), {"tasks": {"other_1": 901}})
    with pytest.raises(ValueError, match="task 'other_1' of the family 'toy' must be named 'toy_…'"):
        register(wrong())
    taken = type("Taken", (Toy,), {"tasks": {"toy_2": 3}})
    with pytest.raises(ValueError, match="task 'toy_2' takes the number 3 of the task 'niah_multikey_1'"):
        register(taken())
    scored = type("Scored", (Toy,), {"metric": "bleu"})
    with pytest.raises(ValueError, match="metric 'bleu' is not one of string_match_all, string_match_part"):
        register(scored())
    register(Toy())
    assert family_of("toy_9").name == "toy" and TASKS.names()[-1] == "toy_1" and "toy_1" not in generated()


def test_a_family_splits_a_ruler_prompt_at_its_last_question() -> None:
    niah = TASKS["niah_single_1"]
    text = "What is the special magic x? filler\nWhat is the special magic number? The special magic number is"
    context, question, prefix = niah.split(text)
    assert context == "What is the special magic x? filler\n" and prefix == "The special magic number is"
    with pytest.raises(SpectraError, match="no question of a niah task"):
        niah.split("nothing here")
    with pytest.raises(SpectraError, match="no answer prefix of a niah task"):
        niah.split("What is the special magic number? none")


def test_largest_fitting_agrees_with_a_scan() -> None:
    rng = random.Random(0)
    for _ in range(200):
        steps = [rng.randint(0, 5) for _ in range(300)]
        cost = [sum(steps[: i + 1]) for i in range(300)]  # non-decreasing
        limit, start, minimum = rng.randint(0, 800), rng.randint(1, 299), rng.randint(1, 20)
        measure = lambda size: cost[min(size, 299)] + (10**6 if size >= 299 else 0)  # noqa: E731
        fits = [size for size in range(minimum, 300) if measure(size) <= limit]
        assert largest_fitting(measure, limit, start, minimum) == (max(fits) if fits else None)


def test_listing_the_tasks_imports_no_torch() -> None:
    code = ("import sys; from spectra.kv.tasks.family import generated; print(len(generated())); "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(Path(__file__).parents[2])})
    count, heavy = done.stdout.split("\n")[:2]
    assert int(count) >= 12 and heavy == "False False"
