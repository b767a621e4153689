"""spectra/kv/tasks/examples.py, the task source: each record's prompt ids as kvpress tokenizes them (and the
query-aware variant), its needle, --batch-size examples per batch (skipped and sharded by position), each prefilled
alone, the refusals once the model has loaded, and what run.json records of the file."""

from __future__ import annotations

import hashlib

import pytest
import torch

from spectra.config import RunConfig
from spectra.errors import SpectraError
from spectra.kv.tasks.prompt import prompt_ids
from spectra.kv.tasks.records import read_records
from spectra.kv.tasks.examples import TaskBatch, TaskSource, prepare

import task_files


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    return task_files.write(tmp_path_factory.mktemp("tasks") / "tasks.jsonl", task_files.records(count=3))


def test_prompts_are_kvpress_ids_with_their_needle(chat_tokenizer, task_file) -> None:
    for record in read_records(task_file):
        example = prepare(chat_tokenizer, record, query_aware=False)
        (asked,) = example.asked
        context_ids, question_ids = prompt_ids(chat_tokenizer, record.context, record.asked[0].text,
                                               record.answer_prefix)
        assert example.context_ids.tolist() == context_ids and asked.ids.tolist() == question_ids
        assert example.tokens == len(context_ids) + len(question_ids) + record.max_new_tokens and asked.index == 0
        spelled = chat_tokenizer.decode(example.context_ids[asked.needle].tolist()).replace(" ", "")
        assert record.answers[0] in spelled and asked.needle.size <= len(record.answers[0])
        aware = prepare(chat_tokenizer, record, query_aware=True)
        (in_view,) = aware.asked
        context_ids, question_ids = prompt_ids(chat_tokenizer, record.context + record.asked[0].text, "",
                                               record.answer_prefix)
        assert aware.context_ids.tolist() == context_ids and in_view.ids.tolist() == question_ids
        assert in_view.needle.tolist() == asked.needle.tolist(), "the needle sits where it sat"
        assert aware.context > example.context and in_view.ids.shape[-1] < asked.ids.shape[-1]
        alone = chat_tokenizer.encode(record.asked[0].text, add_special_tokens=False)  # FINCH's window
        assert aware.question_tokens == len(alone) > 0 and example.question_tokens == 0


def test_each_question_of_a_record_has_its_ids_and_its_own_needle(chat_tokenizer, tmp_path) -> None:
    """A many-question record: every question tokenized after the same context ids, in order, with the context
    positions of its own answers (the second question's needle is the door, the first's the key); the example
    occupies its context, its longest question and the tokens it may generate. It is split before a query-aware
    run."""
    path = task_files.write(tmp_path / "many.jsonl", task_files.many_questions(task_files.records(count=2)))
    for record in read_records(path):
        example = prepare(chat_tokenizer, record, query_aware=False)
        assert [asked.index for asked in example.asked] == [0, 1]
        for asked, question in zip(example.asked, record.asked):
            context_ids, question_ids = prompt_ids(chat_tokenizer, record.context, question.text,
                                                   record.answer_prefix)
            assert example.context_ids.tolist() == context_ids and asked.ids.tolist() == question_ids
            spelled = chat_tokenizer.decode(example.context_ids[asked.needle].tolist()).replace(" ", "")
            assert question.answers[0] in spelled and asked.needle.size <= len(question.answers[0])
        assert set(example.asked[0].needle.tolist()).isdisjoint(example.asked[1].needle.tolist())
        longest = max(asked.ids.shape[-1] for asked in example.asked)
        assert example.tokens == example.context + longest + record.max_new_tokens
        with pytest.raises(ValueError, match="split into one record per question"):
            prepare(chat_tokenizer, record, query_aware=True)


class Recorder:
    """A probe that keeps every layer's prefill it is handed."""

    def __init__(self) -> None:
        self.prefills = []

    def prefilled(self, prefill) -> None:
        self.prefills.append(prefill)


def source(model, path, query_aware=False, windowed=False, questioned=(), batch_size=1, reads=()) -> TaskSource:
    """A source over the file at `path` whose prefill computes the passes `reads` names (`kv.passes`)."""
    return TaskSource(RunConfig(str(model), str(path), batch_size=batch_size), "cpu", read_records(path),
                      query_aware=query_aware, reads=reads, windowed=windowed, questioned=questioned)


def first_prefills(found: TaskSource) -> list:
    """Every layer's prefill of `found`'s first example, as its probe is handed them (the source started first)."""
    found.start()
    recorder = Recorder()
    found.run(next(found.batches(1)), recorder)
    return recorder.prefills


def test_batches_of_examples_skipped_and_sharded(chat_decoder, task_file) -> None:
    found = source(chat_decoder, task_file)
    assert [batch.index for batch in found.batches(3)] == [[0], [1], [2]]
    assert [batch.index for batch in found.batches(3, skip=1)] == [[1], [2]]
    assert [batch.index for batch in found.batches(3, shard=(1, 2))] == [[1]]
    assert [batch.index for batch in found.batches(2)] == [[0], [1]]
    two = source(chat_decoder, task_file, batch_size=2)  # --batch-size 2: two examples' cells decode together
    assert [batch.index for batch in two.batches(3)] == [[0, 1], [2]]
    assert [batch.index for batch in two.batches(3, skip=1)] == [[1, 2]]
    assert [batch.index for batch in two.batches(3, shard=(0, 2))] == [[0, 2]]
    assert [batch.index for batch in found.batches(3, held={1})] == [[0], [2]]  # a checkpoint shard holds 1
    assert [batch.index for batch in found.batches(3, held={0}, shard=(1, 2))] == [[2]]  # the second of those left
    data = found.data()
    assert data["sha256"] == hashlib.sha256(task_file.read_bytes()).hexdigest() and data["records"] == 3


def test_what_does_not_fit_is_refused_once_loaded(chat_decoder, long_decoder, tmp_path) -> None:
    long = task_files.write(tmp_path / "long.jsonl", task_files.records(count=2, max_new_tokens=5000, length=None))
    with pytest.raises(SpectraError, match="long.jsonl line 1: its prompt .* and 5000 new tokens exceed the 4096 "
                                           "positions"):
        source(chat_decoder, long).start()
    short = task_files.write(tmp_path / "short.jsonl", task_files.records(count=2, words=5))
    with pytest.raises(SpectraError, match=r"short.jsonl line 1: its context has 20 tokens; snapkv, finch, pyramidkv, "
                                           r"loki and headbudget\(<run>\) read the last 64 "):
        source(long_decoder, short, windowed=True).start()
    started = source(long_decoder, short)
    started.start()
    assert started.n == max(example.tokens for example in started.examples) and started.prefill_bytes() > 0


def test_a_question_longer_than_finchs_window_is_refused_before_the_weights_load(chat_decoder, tmp_path,
                                                                                  monkeypatch) -> None:
    """Issue 38: query-aware, a press reading the question's tokens as its window (finch) takes at most the WINDOW
    queries the prefill keeps; a longer question (counted as finch counts it: tokenized alone) is refused in one line
    naming the record and the limit, with the tokenizer only — the weights never load. Query-agnostic, or without
    such a press, the record runs."""
    from spectra import models
    from spectra.kv.presses.base import WINDOW

    rows = task_files.records(count=2)
    rows[1]["question"] = "what is the key? " * 20
    path = task_files.write(tmp_path / "long.jsonl", rows)
    loaded = models.load
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: pytest.fail("the weights were loaded"))
    found = source(chat_decoder, path, query_aware=True, questioned=["finch"])
    with pytest.raises(SpectraError) as refused:
        found.start()
    tokens = found.examples[1].question_tokens
    alone = models.load_tokenizer(str(chat_decoder)).encode(rows[1]["question"], add_special_tokens=False)
    assert tokens == len(alone) > WINDOW >= found.examples[0].question_tokens
    assert str(refused.value) == (f"long.jsonl line 2: its question has {tokens} tokens, but finch reads it as its "
                                  f"window of at most {WINDOW} (the context queries the prefill keeps); shorten the "
                                  "question or drop finch from presses")  # as Python spells it
    monkeypatch.setattr(models, "load", loaded)
    for settings in (dict(query_aware=True), dict(query_aware=False, questioned=["finch"])):
        started = source(chat_decoder, path, **settings)
        started.start()
        assert started.loaded.tokenizer is not None and len(started.examples) == 2


def test_the_reconstruction_pass_runs_only_for_a_press_that_reads_it(chat_decoder, task_file) -> None:
    """`reconstruction`: every layer's prefill carries KVzip's scores of the example, computed over its prefilled keys
    and values with the prompts cut from the model's chat template (whose opening is not reconstructed)."""
    import torch

    from spectra.kv import reconstruction

    plain, asked = source(chat_decoder, task_file), source(chat_decoder, task_file, reads=("reconstruction",))
    seen = [first_prefills(found) for found in (plain, asked)]
    assert plain.repetition is None and all("reconstruction" not in prefill.passes for prefill in seen[0])
    pieces = asked.repetition
    opening = asked.loaded.tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert 0 < pieces.prefix == len(asked.loaded.tokenizer.encode(opening.split("x")[0], add_special_tokens=False))
    example = asked.examples[0]
    expected = reconstruction.scores(asked.loaded.model, asked.layers, [part.key for part in seen[0]],
                                     [part.value for part in seen[0]], example.context_ids, pieces, 0)
    for prefill in seen[1]:
        torch.testing.assert_close(prefill.read("reconstruction"), expected)
    assert expected.shape == (asked.layers, asked.kv_heads, example.context)


def test_the_replay_pass_runs_only_for_a_press_that_reads_it(chat_decoder, task_file) -> None:
    """`composition`: every layer's prefill carries KVCompose's replay scores of the example's context (and no KVzip
    reconstruction); without it, none."""
    import torch

    from spectra.kv import composition

    asked = source(chat_decoder, task_file, reads=("composition",))
    prefills = first_prefills(asked)
    example = asked.examples[0]
    expected = composition.scores(asked.loaded.model, asked.layers, example.context_ids, 0)
    assert expected.shape == (asked.layers, asked.kv_heads, example.context) and asked.repetition is None
    for prefill in prefills:
        assert prefill.read("composition") is prefills[0].read("composition") and list(prefill.passes) == ["composition"]
        torch.testing.assert_close(prefill.read("composition"), expected, rtol=0, atol=0)


def test_the_attribution_pass_runs_only_for_a_press_that_reads_it(chat_decoder, task_file) -> None:
    """`gradient`: every layer's prefill carries KVgrad's attribution scores of the example, computed over its
    prefilled keys and values with the prompts cut from the chat template (and no KVzip reconstruction); without it,
    none."""
    import torch

    from spectra.kv import gradient

    plain, asked = source(chat_decoder, task_file), source(chat_decoder, task_file, reads=("gradient",))
    seen = [first_prefills(found) for found in (plain, asked)]
    assert all("gradient" not in prefill.passes for prefill in seen[0])
    example = asked.examples[0]
    expected = gradient.scores(asked.loaded.model, asked.layers, [part.key for part in seen[0]],
                               [part.value for part in seen[0]], example.context_ids, asked.repetition, 0)
    assert expected.shape == (asked.layers, asked.kv_heads, example.context) and asked.repetition.prefix > 0
    for prefill in seen[1]:
        assert prefill.read("gradient") is seen[1][0].read("gradient") and list(prefill.passes) == ["gradient"]
        torch.testing.assert_close(prefill.read("gradient"), expected, rtol=0, atol=0)


def test_each_layer_carries_the_questions_token_count(chat_decoder, task_file) -> None:
    """finch's window: query-aware, every layer's prefill says how many of the context's last tokens are the question
    (the example's count); query-agnostic, none."""

    counts = []
    for aware in (False, True):
        found = source(chat_decoder, task_file, query_aware=aware)
        prefills = first_prefills(found)
        counts.append(({prefill.question_tokens for prefill in prefills}, found.examples[0].question_tokens))
    assert counts[0] == ({0}, 0) and counts[1][0] == {counts[1][1]} and counts[1][1] > 0


def test_a_batchs_examples_are_prefilled_one_after_the_other(chat_decoder, task_file) -> None:
    """A batch of two examples hands the probe the first's layers, then the second's, each its own exact prefill
    (layer 0 begins an example: the probe groups them so)."""
    found = source(chat_decoder, task_file, batch_size=2)
    found.start()
    recorder = Recorder()
    found.run(next(found.batches(3)), recorder)
    layers = found.layers
    assert [prefill.layer for prefill in recorder.prefills] == list(range(layers)) * 2
    contexts = [prefill.key.shape[-2] for prefill in recorder.prefills[::layers]]
    assert contexts == [example.context for example in found.examples[:2]]
    alone = source(chat_decoder, task_file)
    alone.start()
    second = Recorder()
    alone.run(TaskBatch([1]), second)
    for got, want in zip(recorder.prefills[layers:], second.prefills):
        assert torch.equal(got.key, want.key) and torch.equal(got.value, want.value)
