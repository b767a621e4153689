"""`spectra evaluate` (and `spectra cache` on a task file, which runs it), end to end on a tiny Llama with a chat
template: the full cache's answers are `model.generate`'s (transformers' own greedy decoding of the same chat-templated ids, eager attention), every table
holds what the protocol promises, an interrupted run resumed per example equals an uninterrupted one bit for bit,
and bad input is one line with exit 2 before the model loads."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import spectra
from spectra import models
from spectra.errors import SpectraError
from spectra.kv import batching
from spectra.kv.passes import PASSES
from spectra.kv.tasks.haystack import NOISE
from spectra.kv.tasks.prompt import prompt_ids
from spectra.kv.tasks.records import read_records
from spectra.kv.tasks.scoring import score

import task_files
import tiny

QUIET = dict(progress=None, notify=lambda line: None)
SETTINGS = dict(presses="streaming,knorm,snapkv,observed,think", ratios="0.5,0.75", **QUIET)
TABLES = ("examples", "scores", "lengths", "needle", "evicted")


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    return task_files.write(tmp_path_factory.mktemp("tasks") / "tasks.jsonl", task_files.records(count=4))


@pytest.fixture(scope="module")
def finished(chat_decoder, task_file, tmp_path_factory):
    return spectra.cache(str(chat_decoder), str(task_file), out=tmp_path_factory.mktemp("runs") / "tasks", **SETTINGS)


def test_the_full_cache_answers_as_model_generate(finished, chat_decoder, task_file) -> None:
    tokenizer = AutoTokenizer.from_pretrained(chat_decoder)
    model = AutoModelForCausalLM.from_pretrained(chat_decoder, attn_implementation="eager").eval()
    full = finished.examples[finished.examples["press"] == "full"].set_index("example")
    for record in read_records(task_file):
        context_ids, question_ids = prompt_ids(tokenizer, record.context, record.asked[0].text, record.answer_prefix)
        ids = torch.tensor([context_ids + question_ids])
        with torch.no_grad():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=record.max_new_tokens,
                                       do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                       pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:]
        assert generated[0] != tokenizer.eos_token_id, "kvpress and generate differ on a first-token EOS"
        assert full.loc[record.example, "prediction"] == tokenizer.decode(generated, skip_special_tokens=True)


def test_run_json_names_the_bytes_behind_the_numbers(finished, chat_decoder, task_file) -> None:
    """The task file's, the model's weights' and the artifact presses' sha256 (none here), the haystacks and the
    versions: what a published run's numbers are auditable against."""
    import hashlib

    meta = finished.meta
    assert meta["data"]["sha256"] == hashlib.sha256(task_file.read_bytes()).hexdigest()
    assert meta["model"]["weights"] == {"model.safetensors": hashlib.sha256(
        (chat_decoder / "model.safetensors").read_bytes()).hexdigest()}
    assert meta["artifacts"] == [] and meta["haystacks"] and {"torch", "transformers"} <= set(meta["versions"])


def test_the_tables_hold_every_cell(finished, task_file) -> None:
    records = read_records(task_file)
    examples = finished.examples
    assert list(examples.columns[:9]) == ["press", "ratio", "example", "question", "task", "length", "depth",
                                          "prediction", "score"]
    assert (examples["question"] == 0).all() and not (finished.path / "task_questions.csv").exists()
    cells = [("full", 0.0)] + [(p, r) for p in ("streaming", "knorm", "snapkv", "observed", "think")
                               for r in (0.5, 0.75)]
    assert list(dict.fromkeys(zip(examples["press"], examples["ratio"]))) == cells
    assert len(examples) == len(cells) * len(records)
    for _, row in examples.iterrows():
        record = records[row["example"]]
        assert row["score"] == score(record.task, row["prediction"], record.answers)
        assert (row["task"], row["length"], row["depth"]) == (record.task, record.length, record.depth)
    full = examples[examples["press"] == "full"]
    assert (full["kept"] == 1).all() and (full["needle_kept"] == 1).all()
    think = examples[examples["press"] == "think"]
    assert (think["kept"] == 1).all() and (think["needle_kept"] == 1).all(), "ThinK keeps every token"
    scores = finished.scores.set_index(["press", "ratio", "task"])
    for (press, ratio), group in examples.groupby(["press", "ratio"], sort=False):
        row = scores.loc[(press, ratio, "passkey")]
        assert row["score"] == pytest.approx(group["score"].mean()) and row["examples"] == 4
        assert row["full"] == pytest.approx(full["score"].mean())
    needle = finished.needle
    assert len(needle) == len(cells) * 2 * 2  # 2 layers × 2 key/value heads
    assert (needle[needle["press"] == "full"]["needle_kept"] == 1).all()
    assert needle["needle_mass"].between(0, 1).all() and (needle["needle_mass"] > 0).all()
    assert finished.meta["kind"] == "evaluate" and "protocol" not in finished.meta and finished.meta["examples"] == 4
    assert [row["press"] for row in finished.meta["press_seconds"]] == [press for press, _ in cells]
    assert finished.meta["haystacks"] == [{"name": None, "sha256": None, "tasks": ["passkey"]}]  # an older file


def interrupted_and_resumed(model, task_file, tmp_path, settings: dict, after: int, then: dict | None = None):
    """A run stopped once `after` examples are done (its checkpoint left), then resumed to the end (with the
    settings `then` changes)."""
    class Stop(Exception):
        pass

    def interrupt(done, total):
        if done >= after:
            raise Stop

    with pytest.raises(Stop):
        spectra.cache(str(model), str(task_file), out=tmp_path / "cut", **{**settings, "progress": interrupt})
    assert (tmp_path / "cut.partial" / "checkpoint.npz").exists()
    return spectra.cache(str(model), str(task_file), out=tmp_path / "cut", resume=True, **{**settings, **(then or {})})


def test_a_run_resumed_per_example_equals_an_uninterrupted_one(finished, chat_decoder, task_file, tmp_path) -> None:
    resumed = interrupted_and_resumed(chat_decoder, task_file, tmp_path, {**SETTINGS, "checkpoint_seconds": 0.0},
                                      after=2)
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(finished, name), check_exact=True, obj=name)
    for key, value in finished.arrays().items():
        np.testing.assert_array_equal(resumed.arrays()[key], value)


def test_examples_decoded_together_and_resumed_with_another_batch_size(finished, chat_decoder, task_file, tmp_path,
                                                                      monkeypatch, capsys) -> None:
    """--batch-size 3: the cells of three examples decode together (each prefilled alone), then the fourth's; the
    answers are those of one example at a time, the float columns to float32 rounding of differently shaped sums. A
    run stopped after its first batch and resumed with --batch-size 2 equals the uninterrupted run bit for bit (the
    batch size is no part of the run's identity; the examples done are its checkpoint's); run.json records the
    batch size it ran with."""
    together = spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "three", batch_size=3, **SETTINGS)
    assert together.meta["settings"]["batch_size"] == 3 and together.meta["examples"] == 4
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(together, name), getattr(finished, name), rtol=1e-6, obj=name)
    assert (together.examples["prediction"] == finished.examples["prediction"]).all()
    resumed = interrupted_and_resumed(chat_decoder, task_file, tmp_path, {**SETTINGS, "checkpoint_seconds": 0.0,
                                                                          "batch_size": 3}, after=3,
                                      then={"batch_size": 2})
    assert resumed.meta["settings"]["batch_size"] == 2
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(together, name), check_exact=True, obj=name)
    for key, value in together.arrays().items():
        np.testing.assert_array_equal(resumed.arrays()[key], value)
    code, stdout, _ = tiny.run_cli(["evaluate", "--help"], monkeypatch, capsys)
    assert code == 0 and "Examples whose cells decode together" in " ".join(stdout.split())


def test_query_aware_and_fewer_samples(chat_decoder, task_file, tmp_path) -> None:
    notices = []
    run = spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "aware", presses="knorm", ratios="0.5",
                        query_aware=True, samples=2, progress=None, notify=notices.append)
    examples = sorted(run.examples["example"].unique())
    assert len(examples) == 2 and set(examples) <= {0, 1, 2, 3} and run.meta["query_aware"] is True
    assert "evaluating 2 of the 4 records of tasks.jsonl (--samples), spread over its tasks and lengths" in notices


def test_samples_beyond_the_file_run_it_whole_and_say_so(chat_decoder, task_file, tmp_path, monkeypatch,
                                                         capsys) -> None:
    """Issue 55, item 7: --samples beyond the file's records ran them all without a word. One notice line says so (as
    analyze says a corpus yields fewer sequences than asked for), and the whole file runs; as many as it holds, or
    none given, say nothing."""
    notices: list[str] = []
    run = spectra.evaluate(str(chat_decoder), str(task_file), out=tmp_path / "ten", presses="knorm", ratios="0.5",
                           samples=10, progress=None, notify=notices.append)
    assert sorted(run.examples["example"].unique()) == [0, 1, 2, 3]
    assert [line for line in notices if "--samples" in line] == [
        "tasks.jsonl holds 4 records of the 10 asked for (--samples); all of them are evaluated"]
    argv = ["cache", str(chat_decoder), "--data", str(task_file), "--presses", "knorm", "--ratios", "0.5", "--samples",
            "4", "--out", str(tmp_path / "four")]
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 0 and "asked for" not in stderr, stderr


def test_many_questions_per_record(chat_decoder, tmp_path) -> None:
    """Records asking two questions each: a row per (press, ratio, example, question); each question's answer the
    one a record asking it alone of the same context gets; the per-record score the mean over its questions, and
    task_questions.csv each question's mean. Under --query-aware each question is compressed in view on its own
    (one compression per question, kvpress's evaluation convention), equal to the run of the records split."""
    rows = task_files.records(count=3)
    many_path = task_files.write(tmp_path / "many.jsonl", task_files.many_questions(rows))
    split = [{**{key: value for key, value in row.items() if key not in ("questions", "answers")},
              "question": question, "answers": answers}
             for row in task_files.many_questions(rows) for question, answers in zip(row["questions"], row["answers"])]
    split_path = task_files.write(tmp_path / "split.jsonl", split)
    settings = dict(presses="knorm,snapkv", ratios="0.5", **QUIET)
    for aware in (False, True):
        many = spectra.evaluate(str(chat_decoder), str(many_path), out=tmp_path / f"many{aware}", query_aware=aware,
                                **settings)
        alone = spectra.evaluate(str(chat_decoder), str(split_path), out=tmp_path / f"split{aware}",
                                 query_aware=aware, **settings)
        examples, single = many.examples, alone.examples
        assert len(examples) == 3 * 3 * 2 and list(zip(examples["example"], examples["question"]))[:6] == [
            (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
        assert examples["prediction"].tolist() == single["prediction"].tolist()
        assert examples["score"].tolist() == single["score"].tolist()
        scores = many.scores.set_index(["press", "ratio"])
        questions = pd.read_csv(many.path / "task_questions.csv").set_index(["press", "ratio", "question"])
        for (press, ratio), group in examples.groupby(["press", "ratio"], sort=False):
            per_record = group.groupby("example")["score"].mean()
            assert scores.loc[(press, ratio), "score"] == pytest.approx(per_record.mean())
            assert scores.loc[(press, ratio), "examples"] == 3
            for question in (0, 1):
                assert questions.loc[(press, ratio, question), "score"] == pytest.approx(
                    group[group["question"] == question]["score"].mean())
        # issue 55, item 7: the header said "6 examples" above tables of 3 under --query-aware (its compressions)
        assert many.meta["examples"] == 3 and many.meta["samples"] == (6 if aware else 3)
        shown = printed(many)
        assert shown.startswith(f"{many.label}: 3 examples, ") and shown.count("passkey, 3 examples") == 1, shown


def printed(run) -> str:
    """What `spectra evaluate RUN` prints of `run`, its lines joined (the console wraps at its width)."""
    from spectra.report import evaluate as side
    from spectra.report.console import out

    with out.capture() as captured:
        side.show(run)
    return " ".join(captured.get().split())


def test_a_press_reading_the_queries_before_rope_gets_them(chat_decoder, task_file, tmp_path) -> None:
    """expected_attention reads every context query before RoPE, which the task prefill keeps only for a press
    declaring `queries` — named alone or wrapped (a prefill without them is refused by the press)."""
    presses = ("expected_attention", "adakv(expected_attention)")
    run = spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "expected", presses=",".join(presses),
                        ratios="0.5", samples=2, **QUIET)
    assert set(presses) < set(run.examples["press"])
    assert (run.examples.query("press in @presses")["kept"] < 0.6).all()


TASKS = ("passkey", "niah_single_1", "vt", "cwe")
#: the sha256 of RULER's noise sentence
NOISE_SHA = hashlib.sha256(NOISE.encode()).hexdigest()


def test_a_task_file_runs_whole_and_samples_name_the_tasks_they_leave_out(chat_decoder, tmp_path, monkeypatch,
                                                                           capsys) -> None:
    """A file of 20 records ordered by task ran its first 16 (--samples' default): a whole task vanished from
    task_scores.csv. It runs whole; --samples 4 takes one record of each task; --samples 2 names the two it leaves
    out, before the run and in the printed run."""
    rows = [row for seed, task in enumerate(TASKS) for row in task_files.records(count=5, seed=seed, task=task)]
    for row in rows:  # what `spectra tasks` writes: the noise of passkey, niah_single_1 and vt; nothing for cwe
        row["haystack"], row["haystack_sha256"] = ("noise", NOISE_SHA) if row["task"] != "cwe" else (None, None)
    path = task_files.write(tmp_path / "tasks.jsonl", rows)
    whole = spectra.cache(str(chat_decoder), str(path), out=tmp_path / "whole", presses="knorm", ratios="0.5", **QUIET)
    assert sorted(whole.examples["example"].unique()) == list(range(20)) and set(whole.scores["task"]) == set(TASKS)
    four = spectra.cache(str(chat_decoder), str(path), out=tmp_path / "four", presses="knorm", ratios="0.5",
                         samples=4, **QUIET)
    assert sorted(four.examples.drop_duplicates("example")["task"]) == sorted(TASKS)
    argv = ["cache", str(chat_decoder), "--data", str(path), "--presses", "knorm", "--ratios", "0.5", "--samples", "2",
            "--out", str(tmp_path / "two")]
    code, stdout, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    meta = json.loads((tmp_path / "two" / "run.json").read_text())
    left = meta["data"]["tasks_left_out"]
    assert code == 0 and len(left) == 2 and set(left) < set(TASKS), stderr
    ran = [task for task in TASKS if task not in left and task != "cwe"]  # the haystacks of the records evaluated
    assert meta["haystacks"] == ([{"name": "noise", "sha256": NOISE_SHA, "tasks": ran}] if ran else [])
    assert (f"haystacks: {', '.join(ran)} read noise (sha256 {NOISE_SHA[:12]}…)" in stderr) == bool(ran)
    assert f"spread over its tasks and lengths; tasks left out: {', '.join(left)}" in stderr
    assert f"--samples left out every record of {', '.join(left)}: without it the whole file runs" in " ".join(
        stdout.split())


def test_a_finished_run_reprints_and_plots(finished, monkeypatch, capsys) -> None:
    code, stdout, _ = tiny.run_cli(["cache", str(finished.path), "--plot"], monkeypatch, capsys)
    assert code == 0 and "passkey" in stdout and "task_scores.png" in stdout and "needle_heatmap.png" in stdout
    assert spectra.load_run(finished.path).examples.equals(finished.examples)


def test_answers_do_not_depend_on_how_the_cells_are_grouped(finished, chat_decoder, task_file, tmp_path,
                                                            monkeypatch) -> None:
    """The default budget decodes every cell of an example as one batch; a budget of three full caches decodes them
    in several groups: the same answers, the same tables."""
    with pytest.raises(SpectraError) as refused:
        spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "none", decode_memory=1e-9, **SETTINGS)
    least = float(str(refused.value).split("give at least decode_memory=")[1])
    sizes = []
    original = batching.CacheBatch.of
    monkeypatch.setattr(batching.CacheBatch, "of", lambda *args: sizes.append(len(args[0])) or original(*args))
    grouped = spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "grouped", decode_memory=3 * least,
                            **SETTINGS)
    assert len(sizes) > 4 * 2 and max(sizes) < 11, sizes
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(grouped, name), getattr(finished, name), rtol=1e-6, obj=name)
    assert (grouped.examples["prediction"] == finished.examples["prediction"]).all()


def test_a_budget_below_one_cell_says_the_smallest_that_works(chat_decoder, task_file, tmp_path, monkeypatch,
                                                              capsys) -> None:
    argv = ["evaluate", str(chat_decoder), "--data", str(task_file), "--presses", "knorm", "--ratios", "0.5",
            "--decode-memory", "0.000001", "--out", str(tmp_path / "run")]
    code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
    assert code == 2 and stderr.count("\n") == 1 and "--decode-memory 1e-06 GiB cannot hold the full cache" in stderr
    least = float(stderr.split("give at least --decode-memory ")[1].split()[0])
    argv[argv.index("0.000001")] = str(least)
    assert tiny.run_cli(argv, monkeypatch, capsys)[0] == 0


@pytest.mark.parametrize("case", ["unknown-task", "missing-field", "empty", "positions", "fit-samples", "bytes-kept",
                                  "encoder", "no-answers-first", "no-question-first", "array", "answer-missing",
                                  "empty-context", "decode-memory", "question-and-questions", "questions-answers",
                                  "empty-questions", "decoding-many-questions", "finch-question"])
def test_bad_input_is_one_line_and_exit_2_before_the_model_loads(case, chat_decoder, bert_dir, tmp_path,
                                                                  monkeypatch, capsys) -> None:
    rows = task_files.records(count=2)
    model, extra, message, message2 = str(chat_decoder), [], None, ""
    if case == "unknown-task":
        rows[1]["task"], message = "sudoku", "tasks.jsonl line 2: unknown task 'sudoku'"
    elif case == "missing-field":
        del rows[1]["answers"]
        message = "tasks.jsonl line 2 has no field 'answers'"
    elif case == "empty":
        rows, message = [], "holds no record"
    elif case == "positions":
        rows[0]["length"], message = 5000, "tasks.jsonl line 1: its length 5000 is beyond the 4096 positions"
    elif case == "bytes-kept":
        extra, message = ["--bytes-kept", "0.5"], "--bytes-kept belongs to the NLL study of text; tasks.jsonl is a task"
    elif case == "fit-samples":
        extra, message = ["--presses", "lowrank", "--fit-samples", "1"], "--fit-samples belongs to the NLL study"
    elif case in ("no-answers-first", "no-question-first"):  # read as a text corpus before (no column 'text')
        field = "answers" if case == "no-answers-first" else "question"
        del rows[0][field]
        message = f"tasks.jsonl line 1 has no field '{field}'"
    elif case == "array":
        rows, message = [rows], "tasks.jsonl holds a JSON array of 2 records; a task file holds one record"
    elif case == "answer-missing":  # ran to the end before: full cache 0, needle_kept empty
        rows[1]["answers"], message = ["nowhere"], "tasks.jsonl line 2: the answer 'nowhere' does not occur in its"
    elif case == "empty-context":
        rows[1]["context"], message = "", "tasks.jsonl line 2: 'context' is empty"
    elif case == "decode-memory":
        extra, message = ["--decode-memory", "0"], "--decode-memory must be a positive number of GiB, got 0"
    elif case == "question-and-questions":
        rows[1] = {**task_files.many_questions(rows)[1], "question": "what?"}
        message = "tasks.jsonl line 2 has both 'question' and 'questions'; a record asks one question"
    elif case == "questions-answers":
        rows[1] = {**task_files.many_questions(rows)[1], "answers": [["tarnel"]]}
        message = "tasks.jsonl line 2: 'answers' must hold one entry per question"
    elif case == "empty-questions":
        rows[1] = {**task_files.many_questions(rows)[1], "questions": [], "answers": []}
        message = "tasks.jsonl line 2: 'questions' must be a non-empty list of questions"
    elif case == "decoding-many-questions":
        rows[1] = task_files.many_questions(rows)[1]
        extra = ["--presses", "knorm,decoding(knorm)"]
        message = ("tasks.jsonl line 2 asks 2 questions, and decoding(knorm) compresses while it decodes: its cache "
                   "after one answer is not the context's")
    elif case == "finch-question":  # refused after the model loaded before (issue 38): its tokenizer is enough
        rows[1]["question"] = "what is the key? " * 20
        extra = ["--presses", "knorm,finch", "--query-aware"]
        message = "tasks.jsonl line 2: its question has "
        message2 = "tokens, but finch reads it as its window of at most 64 (the context queries the prefill keeps)"
    else:
        model, message = str(bert_dir), "is an encoder"
    path = task_files.write(tmp_path / "tasks.jsonl", rows)
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    out = tmp_path / "run"
    code, _, stderr = tiny.run_cli(["cache", model, "--data", str(path), "--out", str(out), *extra], monkeypatch,
                                   capsys)
    assert code == 2 and message in stderr and stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert message2 in stderr and not out.exists() and not out.with_name("run.partial").exists()


def test_tasks_run_the_records_of_the_tasks_named_on_their_lines_and_pool_with_the_whole_file(
        chat_decoder, tmp_path, monkeypatch, capsys) -> None:
    """--tasks keeps each record's line: the run's examples are the file's lines of those tasks, scored as a run of the
    whole file scores them, and runs of the same tasks pool into one board; a task the file lacks, or an empty name,
    is one line before the model loads."""
    from spectra.report import leaderboard

    rows = task_files.records(count=4)
    for row in rows[2:]:
        row["task"] = "niah_single_1"
    path = task_files.write(tmp_path / "two.jsonl", rows)
    notices: list[str] = []
    part = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "part", presses="knorm", ratios="0.5",
                            tasks="niah_single_1", progress=None, notify=notices.append)
    assert "evaluating the 2 records of niah_single_1 in two.jsonl (--tasks), each keeping its line" in notices
    assert part.meta["settings"]["extra"]["tasks"] == "niah_single_1"
    whole = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "whole", presses="knorm", ratios="0.5",
                             **QUIET)
    mine, theirs = (pd.read_csv(run.path / "task_examples.csv") for run in (part, whole))
    assert sorted(mine["example"].unique()) == [2, 3]
    keys = ["press", "ratio", "example"]
    pd.testing.assert_frame_equal(mine.set_index(keys)[["prediction", "score"]],
                                  theirs[theirs["example"] >= 2].set_index(keys)[["prediction", "score"]])
    other = spectra.evaluate(str(chat_decoder), str(path), out=tmp_path / "other", presses="streaming", ratios="0.5",
                             tasks="niah_single_1", **QUIET)
    pooled = leaderboard.pooled([part, other])  # runs of the same tasks pool into one board
    assert sorted(pooled["press"].unique()) == ["full", "knorm", "streaming"] and set(pooled["example"]) == {2, 3}
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    for given, message in (("passkey,vt", "two.jsonl holds no record of vt (--tasks); its tasks: passkey, "
                                          "niah_single_1"),
                           ("passkey,", "--tasks takes task names separated by commas, got 'passkey,'")):
        out = tmp_path / "refused"
        code, _, stderr = tiny.run_cli(["evaluate", str(chat_decoder), "--data", str(path), "--tasks", given, "--out",
                                        str(out)], monkeypatch, capsys)
        assert code == 2 and message in stderr and stderr.count("\n") == 1, stderr
        assert not out.exists() and not out.with_name("refused.partial").exists()


def test_the_task_study_is_a_kind_of_its_own(chat_decoder, task_file, finished, tmp_path, monkeypatch,
                                             capsys) -> None:
    """Issue 37, item 1: `spectra evaluate` / `spectra.evaluate` run the task study and give what `spectra cache` on
    the same task file gives (cache hands the file over); its read side is `load/show/plot`; text data, and options of
    the NLL study, are refused in one line before the model loads."""
    direct = spectra.evaluate(str(chat_decoder), str(task_file), out=tmp_path / "direct", **SETTINGS)
    assert isinstance(direct, spectra.TaskRun) and direct.meta["kind"] == "evaluate"
    for table in TABLES:
        assert getattr(direct, table).equals(getattr(finished, table)), table
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    text = tmp_path / "text.txt"
    text.write_text("plain prose, no records\n" * 20)
    code, _, stderr = tiny.run_cli(["evaluate", str(chat_decoder), "--data", str(text)], monkeypatch, capsys)
    assert code == 2 and "is not a task file" in stderr and stderr.count("\n") == 1, stderr
    code, _, stderr = tiny.run_cli(["evaluate", str(chat_decoder), "--data", str(task_file), "--context", "64"],
                                   monkeypatch, capsys)
    assert code == 2 and "--context" in stderr and stderr.count("\n") == 1, stderr
    code, stdout, _ = tiny.run_cli(["evaluate", str(direct.path)], monkeypatch, capsys)
    assert code == 0 and "passkey" in stdout


def test_stop_answered_cuts_answers_where_their_scores_settle(chat_decoder, task_file, finished, tmp_path,
                                                             monkeypatch, capsys) -> None:
    """`--stop-answered`: the same scores (on the tiny model, which never answers, nothing settles), recorded in
    run.json and said by the printout; with a stand-in test of settling (six characters of text), each stored answer is
    the full answer's shortest token prefix that passes it, so the probe hands each row its own question's test."""
    run = spectra.evaluate(str(chat_decoder), str(task_file), out=tmp_path / "real", stop_answered=True, **SETTINGS)
    assert run.meta["stop_answered"] is True and finished.meta["stop_answered"] is False
    code, stdout, _ = tiny.run_cli(["evaluate", str(run.path)], monkeypatch, capsys)
    assert code == 0 and "stopped once its score was final (--stop-answered)" in " ".join(stdout.split())
    pd.testing.assert_frame_equal(run.scores, finished.scores, check_exact=True)
    seen = []

    def stand_in(task, text, answers):
        seen.append((task, tuple(answers)))
        return len(text) >= 6

    monkeypatch.setattr("spectra.probes.tasks.settled", stand_in)
    cut = spectra.evaluate(str(chat_decoder), str(task_file), out=tmp_path / "cut", stop_answered=True, **SETTINGS)
    records = {record.example: record for record in read_records(task_file)}
    assert {(task, answers) for task, answers in seen} == {(r.task, tuple(r.asked[0].answers)) for r in records.values()}
    whole = finished.examples.set_index(["press", "ratio", "example"])["prediction"]
    shorter = 0
    for (press, ratio, example), prediction in cut.examples.set_index(["press", "ratio", "example"])["prediction"].items():
        full = whole.loc[(press, ratio, example)]
        assert full.startswith(prediction) and (len(prediction) >= 6 or prediction == full), (prediction, full)
        shorter += len(prediction) < len(full)
    assert shorter > len(cut.examples) // 2


def test_each_unreadable_task_file_is_said_as_what_it_is(chat_decoder, task_file, tmp_path, monkeypatch,
                                                         capsys) -> None:
    """Issue 55, item 2: a missing --data file, a non-UTF-8 file and invalid JSON on line 1 all said "is not a task
    file … run `spectra cache` for the NLL of text", and no --data read imdb and refused it. Each is its own line, exit
    2, before the model loads; --help shows no default for --data; text stays "not a task file"."""
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    (tmp_path / "latin1.jsonl").write_bytes(json.dumps(task_files.records(count=1)[0]).encode()[:30] + b"caf\xe9\n")
    (tmp_path / "broken.jsonl").write_text('{"context": "x", oops\n')
    lines = [json.dumps(row) for row in task_files.records(count=2)]
    (tmp_path / "second.jsonl").write_text(lines[0] + "\n{oops\n")
    (tmp_path / "text.jsonl").write_text('{"text": "plain prose"}\n')
    for data, message in (
            (None, "error: spectra evaluate reads a task file (.jsonl, one record of kvpress's fields a line, as "
                   "`spectra tasks` writes them): give it as --data FILE"),
            (tmp_path / "missing.jsonl", f"error: --data {tmp_path / 'missing.jsonl'}: no such file; give a task file"),
            (tmp_path, f"error: --data {tmp_path} is a directory; give a task file"),
            (tmp_path / "latin1.jsonl", f"error: {tmp_path / 'latin1.jsonl'} is not UTF-8 text (byte 0xe9 on line 1); "
                                        "a task file is UTF-8 jsonl"),
            (tmp_path / "broken.jsonl", f"error: {tmp_path / 'broken.jsonl'} line 1 is not JSON: Expecting property "
                                        "name enclosed in double quotes (column 18); a task file holds one JSON record"),
            (tmp_path / "second.jsonl", f"error: {tmp_path / 'second.jsonl'} line 2 is not JSON: Expecting property "
                                        "name enclosed in double quotes (column 2)"),
            (tmp_path / "text.jsonl", f"error: {tmp_path / 'text.jsonl'} is not a task file (kvpress's records")):
        argv = ["evaluate", str(chat_decoder), *([] if data is None else ["--data", str(data)]),
                "--out", str(tmp_path / "run")]
        code, _, stderr = tiny.run_cli(argv, monkeypatch, capsys)
        assert code == 2 and stderr.startswith(message) and stderr.count("\n") == 1, stderr
        assert ("spectra cache" in stderr) == (data == tmp_path / "text.jsonl"), stderr
    assert not (tmp_path / "run").exists()
    with pytest.raises(SpectraError, match="give it as data=FILE"):
        spectra.evaluate(str(chat_decoder), **QUIET)
    code, stdout, _ = tiny.run_cli(["evaluate", "--help"], monkeypatch, capsys)
    help_text = " ".join(stdout.split())
    assert code == 0 and "imdb" not in help_text and "A task file, required" in help_text, help_text


def test_a_task_run_written_by_cache_before_the_kind_existed_loads(finished, tmp_path) -> None:
    """run.json of a task study written as kind 'cache' with protocol 'tasks' reads back as the task study's run."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(finished.path, old)
    meta = json.loads((old / "run.json").read_text())
    (old / "run.json").write_text(json.dumps({**meta, "kind": "cache", "protocol": "tasks"}))
    loaded = spectra.load_run(old)
    assert isinstance(loaded, spectra.TaskRun) and loaded.meta["kind"] == "evaluate"
    assert loaded.scores.equals(finished.scores)


@pytest.mark.cuda
def test_on_cuda_every_press_answers_as_on_the_cpu(chat_decoder, task_file, tmp_path) -> None:
    """Every press (the default list) prefilled, compressed and decoded in batches on the GPU: the full cache answers
    as on the CPU, the other cells keep the CPU's shares (a score's float32 rounding may move a near-tie by a row)
    and answer alike in three of four cells (a flipped near-tie anywhere in a random model's answer changes
    it, and `random` draws from the device's own generator as kvpress's does: 82 of 92 on an H100); in bfloat16 the cache is held in the model's dtype (half the bytes)."""
    every = dict(ratios="0.5", **QUIET)
    cells = ["press", "ratio", "example"]
    cpu = spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "cpu", device="cpu", **every)
    gpu = spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "gpu", device="cuda", **every)
    a, b = cpu.examples.set_index(cells).sort_index(), gpu.examples.set_index(cells).sort_index()
    assert a.index.equals(b.index)
    for exact in ("full", "streaming"):  # no score decides what these keep: the answers are the CPU's
        assert (a.loc[exact, "prediction"] == b.loc[exact, "prediction"]).all(), exact
    differ = a.index[a["prediction"] != b["prediction"]].tolist()
    assert len(differ) <= 0.25 * len(a), f"{len(differ)} of {len(a)} cells answer otherwise on the GPU: {differ}"
    print(f"cells answering otherwise on the GPU: {len(differ)} of {len(a)}: {differ}")
    assert (a["kept"] - b["kept"]).abs().max() <= 0.05
    half = spectra.cache(str(chat_decoder), str(task_file), out=tmp_path / "half", device="cuda", dtype="bfloat16",
                         **every)
    c = half.examples.set_index(cells).sort_index()
    assert c.index.equals(a.index)
    assert (c.loc["full", "bytes"] * 2 == a.loc["full", "bytes"]).all()


def test_a_sliding_window_model_runs_guarded_and_answers_as_generate(tmp_path, monkeypatch, capsys) -> None:
    """A tiny Gemma 3 (local layers of window 8 before a global one) through the whole task study: the guard passes,
    the full cache answers every record as `model.generate`, each local layer keeps its window whatever the press
    (bytes counted so) — kvzip's and kvgrad's ranking the global layers' pairs alone, int(N_global · r) of them
    evicted, kvcompose's budget n_kept(N_global, r) of them — and what does not follow local layers is one line, exit
    2, before any example: a press moving its kept keys (finch, among spectra cache's default presses), a whole-model
    pass declared without windows."""
    model_dir = tiny.save_gemma3(tmp_path / "gemma")
    path = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=3, words=40))
    run = spectra.evaluate(str(model_dir), str(path), presses="knorm,streaming,kvzip,kvgrad,kvcompose",
                           ratios="0.5", out=tmp_path / "run", **QUIET)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    full = run.examples[run.examples["press"] == "full"].set_index("example")
    for record in read_records(path):
        context_ids, question_ids = prompt_ids(tokenizer, record.context, record.asked[0].text, record.answer_prefix)
        ids = torch.tensor([context_ids + question_ids])
        with torch.no_grad():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=record.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                       pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:]
        assert full.loc[record.example, "prediction"] == tokenizer.decode(generated, skip_special_tokens=True)
    knorm, kvzip, kvgrad, kvcompose = (run.examples[run.examples["press"] == press].set_index("example")
                                       for press in ("knorm", "kvzip", "kvgrad", "kvcompose"))
    for record in read_records(path):  # two local layers keep 7 rows; the global one half of L
        length = full.loc[record.example, "bytes"] / 128 - 7 - 7  # one key/value head: 16 + 16 float32
        assert knorm.loc[record.example, "bytes"] == 128 * (7 + 7 + max(1, int(length * 0.5)))
        assert kvzip.loc[record.example, "bytes"] == 128 * (7 + 7 + length - int(length * 0.5))
        assert kvgrad.loc[record.example, "bytes"] == 128 * (7 + 7 + length - int(length * 0.5))
        assert kvcompose.loc[record.example, "bytes"] == 128 * (7 + 7 + max(1, int(length * 0.5)))
    text = ["--data", str(tiny.write_text(tmp_path / "t.txt")), "--context", "96", "--continuation", "16", "--ratios", "0.25"]
    capsys.readouterr()
    monkeypatch.setitem(PASSES, "composition", dataclasses.replace(PASSES["composition"], windows=False))
    for argv, said in ((["cache", str(model_dir), *text], ("finch moves kept keys to positions 0 … m − 1",
                                                            "leave it out on this model (--presses streaming,knorm,")),
                       (["evaluate", str(model_dir), "--data", str(path), "--presses", "kvcompose"],
                        ("the presses kvcompose does not follow yet: leave them out",))):
        code, _, stderr = tiny.run_cli(argv + ["--out", str(tmp_path / "refused")], monkeypatch, capsys)
        assert code == 2 and "sliding-window layers" in stderr and all(part in stderr for part in said), stderr
        assert len(stderr.strip().splitlines()) == 1 and not (tmp_path / "refused").exists()


def test_local_layers_option_is_recorded_and_refused_where_it_cannot_apply(chat_decoder, task_file, tmp_path,
                                                                             monkeypatch, capsys) -> None:
    """Issue 52, item 2: `--local-layers kvpress` on a tiny Gemma 3 compresses every layer from the whole context
    (bytes: each layer its n_kept(L, r) rows of the L it stores, kvpress's cache), is recorded in run.json and said
    by the printout; refused in one line, exit 2, nothing written: on a model without local layers before it loads,
    with a press whose effect on a local layer is not reproduced at once, and with a press reading more last queries
    than a local layer holds once the model has loaded, before any example."""
    model_dir = tiny.save_gemma3(tmp_path / "gemma")
    path = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=2, words=40))
    run = spectra.evaluate(str(model_dir), str(path), presses="knorm", ratios="0.5", local_layers="kvpress",
                           out=tmp_path / "run", **QUIET)
    assert run.meta["local_layers"] == "kvpress" == json.loads((run.path / "run.json").read_text())["local_layers"]
    examples = run.examples.set_index(["press", "example"])
    for example in examples.loc["full"].index:
        length = int(examples.loc[("full", example), "bytes"]) // (3 * 128)  # 3 layers, 1 head of 16 + 16 float32
        assert examples.loc[("knorm", example), "bytes"] == 3 * 128 * max(1, int(length * 0.5))
    code, stdout, _ = tiny.run_cli(["evaluate", str(run.path)], monkeypatch, capsys)
    assert code == 0 and "local layers: kvpress" in " ".join(stdout.split())
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    for model, presses, said in (
            (chat_decoder, "knorm", "--local-layers compress compresses sliding-window layers, but tiny-chat has "
                                    "none"),
            (model_dir, "decoding(knorm)", "decoding(knorm) compresses while it decodes"),
            (model_dir, "expected_attention", "expected_attention reads rotary positions"),
            (model_dir, "linformer", "linformer keeps rows that are no context tokens"),
            (model_dir, "kvzip", "kvzip runs a whole-model pass, which spectra runs with each local layer keeping its window only")):
        code, _, stderr = tiny.run_cli(["evaluate", str(model), "--data", str(path), "--presses", presses,
                                        "--local-layers", "compress", "--out", str(tmp_path / "refused")],
                                       monkeypatch, capsys)
        assert code == 2 and said in stderr and stderr.count("\n") == 1, stderr
    code, _, stderr = tiny.run_cli(["evaluate", str(model_dir), "--data", str(path), "--presses", "adakv(knorm)",
                                    "--local-layers", "kvpress"], monkeypatch, capsys)
    assert code == 2 and "adakv(knorm) is no scorer" in stderr and stderr.count("\n") == 1, stderr
    with pytest.raises(SpectraError, match="unknown local_layers 'all'; use one of keep, compress, kvpress"):
        spectra.evaluate(str(model_dir), str(path), local_layers="all", **QUIET)
    monkeypatch.undo()
    code, _, stderr = tiny.run_cli(["evaluate", str(model_dir), "--data", str(path), "--presses", "snapkv",
                                    "--local-layers", "compress", "--out", str(tmp_path / "refused")],
                                   monkeypatch, capsys)
    assert code == 2 and "snapkv reads the last 64 context queries" in stderr and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow  # the real Gemma 3 270M: its GGUF dequantized once into the session's model cache, on a CPU
def test_the_real_gemma3_answers_as_generate_and_keeps_each_local_window(tmp_path) -> None:
    """Issue 52 on the real model (skipped without its package): one record longer than the sliding window (512), the
    full cache's greedy answer token for token transformers' `generate` (eager attention, the model cache's weights),
    and knorm at r = 0.5 under `--local-layers keep` storing each local layer's window, W − 1 rows, and n_kept(L, r)
    rows of each global layer."""
    from spectra import modelcache, sliding
    from spectra.kv.presses import n_kept

    path = tiny.gemma3_270m()
    file = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=1, words=700, length=None))
    run = spectra.evaluate(path, str(file), presses="knorm", ratios="0.5", local_layers="keep", out=tmp_path / "run",
                           **QUIET)
    where = modelcache.entry(path).directory
    tokenizer = AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(where, attn_implementation="eager").eval()
    record = read_records(file)[0]
    context_ids, question_ids = prompt_ids(tokenizer, record.context, record.asked[0].text, record.answer_prefix)
    ids = torch.tensor([context_ids + question_ids])
    with torch.no_grad():
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=record.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                   pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:]
    examples = run.examples.set_index("press")
    assert examples.loc["full", "prediction"] == tokenizer.decode(generated, skip_special_tokens=True)
    windows = sliding.windows(model.config)
    length, local = len(context_ids), [window for window in windows if window is not None]
    assert length > max(local) and 0 < len(local) < len(windows)
    row = 2 * model.config.head_dim * model.config.num_key_value_heads * 4  # a key and a value, float32
    assert examples.loc["full", "bytes"] == row * sum(length if window is None else window - 1 for window in windows)
    assert examples.loc["knorm", "bytes"] == row * sum(n_kept(length, 0.5) if window is None else window - 1
                                                       for window in windows)
