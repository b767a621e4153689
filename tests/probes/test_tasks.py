"""The task probe against computations written here: the needle each press kept per layer and key/value head from
the press applied to a dense prefill (the eager P of one forward pass) and counted with sets, the share of rows kept,
the question's attention on the needle from the dense P of one forward pass over context + question; and the tables
built from its state — scores, the failed cells (below the full cache) and the layers where every head lost the
needle."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from spectra import capture
from spectra.kv import continuation
from spectra.config import RunConfig
from spectra.kv import batching
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.decoding import INTERVAL
from spectra.probes.tasks import TaskProbe
from spectra.kv.tasks.records import read_records
from spectra.kv.tasks.examples import TaskBatch, TaskSource

import task_files

PRESSES, RATIOS = ("streaming", "knorm"), (0.5, 0.75)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    chat_decoder = task_files.save_chat_decoder(tmp_path_factory.mktemp("models") / "tiny-chat")
    path = task_files.write(tmp_path_factory.mktemp("tasks") / "tasks.jsonl", task_files.records(count=3))
    source = TaskSource(RunConfig(str(chat_decoder), str(path), batch_size=2), "cpu", read_records(path),
                        query_aware=False, reads=(), windowed=False)
    source.start()
    probe = TaskProbe(source, PRESSES, RATIOS, 0)  # two examples' cells decoded together, then the third's
    for batch in source.batches(3):
        source.run(batch, probe)
        probe.after_batch(batch)
    return source, probe


def dense(source, example):
    """Each layer's prefill from the eager P of one forward pass over the context, and each layer's P rows of the
    question's queries (H, n, L + n) from one forward pass over context + question."""
    loaded = source.loaded
    prefills, rows = {}, {}
    context = example.context_ids[None]
    capture.forward(loaded.model, loaded.layers,
                    lambda c: prefills.__setitem__(c.layer, continuation.from_captured(c, 0, example.context, None, 0, 0)),
                    None, [0], input_ids=context)
    whole = torch.cat([example.context_ids, example.asked[0].ids])[None]
    capture.forward(loaded.model, loaded.layers, lambda c: rows.__setitem__(c.layer, c.p[0, :, example.context:]),
                    None, [0], input_ids=whole)
    return prefills, rows


def test_needle_kept_and_attention_equal_the_dense_prefill(probed) -> None:
    source, probe = probed
    for position, example in enumerate(source.examples):
        prefills, rows = dense(source, example)
        needle = set(example.asked[0].needle.tolist())
        assert needle
        for cell, (press, ratio) in enumerate(probe.variants):
            for layer in range(source.layers):
                if press == "full":
                    kept = [set(range(example.context))] * source.kv_heads
                else:
                    kept = [set(row.tolist()) for row in REGISTRY[press].compress(prefills[layer], ratio).kept]
                want = [len(needle & heads) / len(needle) for heads in kept]
                np.testing.assert_allclose(probe.survival[cell, position, layer], want, rtol=0, atol=0)
            share = 1.0 if press == "full" else n_kept(example.context, ratio) / example.context
            assert probe.kept[cell, position] == pytest.approx(share)
            # bytes: kept rows × (key + value) × 4 bytes (float32), over every layer and key/value head
            config = source.loaded.model.config
            row = 2 * (config.hidden_size // config.num_attention_heads) * 4
            whole = source.layers * source.kv_heads * example.context * row
            kept_rows = example.context if press == "full" else n_kept(example.context, ratio)
            assert probe.bytes[cell, position].tolist() == [source.layers * source.kv_heads * kept_rows * row, whole]
        for layer in range(source.layers):
            mass = rows[layer][..., example.asked[0].needle].sum(-1).mean(-1)  # (H,)
            grouped = mass.unflatten(0, (source.kv_heads, -1)).mean(-1).double().numpy()
            np.testing.assert_allclose(probe.mass[position, layer], grouped, atol=1e-6)


def test_tables_from_the_state(probed, monkeypatch) -> None:
    source, probe = probed
    answer = source.examples[0].record.answers[0]
    # the full cache answers example 0, every press misses it; other examples: nobody answers
    predictions = [[f"it is {answer}." if cell == 0 and position == 0 else "no idea" for position in range(3)]
                   for cell in range(len(probe.variants))]
    monkeypatch.setattr(probe, "predictions", lambda: predictions)
    survival = probe.survival.copy()
    try:
        knorm = probe.variants.index(("knorm", 0.75))
        probe.survival[knorm, 0] = [[0.0, 0.0], [0.0, 0.5]]  # layer 0: every head lost the needle
        tables = probe.tables()
    finally:
        probe.survival = survival
    examples = tables["task_examples.csv"]
    first = examples[examples["example"] == 0].set_index(["press", "ratio"])["score"]
    assert first[("full", 0.0)] == 1 and (first.drop(("full", 0.0)) == 0).all()
    evicted = tables["task_evicted.csv"]
    assert len(evicted) == 4 and set(evicted["example"]) == {0}
    row = evicted.set_index(["press", "ratio"]).loc[("knorm", 0.75)]
    assert (row["evicted_layers"], row["evicted"], row["first_evicted"]) == ("0", 1, 0)
    assert row["score"] == 0 and row["full"] == 1
    needle = tables["task_needle.csv"].set_index(["press", "ratio", "layer", "head"])
    assert needle.loc[("knorm", 0.75, 1, 1), "needle_kept_failed"] == 0.5
    assert needle.loc[("knorm", 0.75, 0, 0), "failed"] == 1
    scores = tables["task_scores.csv"].set_index(["press", "ratio"])
    assert scores.loc[("full", 0.0), "score"] == pytest.approx(1 / 3)
    assert scores.loc[("knorm", 0.5), "delta"] == pytest.approx(-1 / 3)


def test_a_decoding_press_answers_from_the_schedules_cache(probed) -> None:
    """decoding(knorm) cells: paced beyond the answer they are the full cache's answers; paced every step they are the
    greedy answers of `generation.greedy_alone` with that recompression (tests/test_decoding.py holds it against a
    dense forward), kept share the ratio's target over the context and no needle survival (the rows are no longer positions)."""
    from spectra.kv import generation
    from spectra.kv.presses import REGISTRY

    source, _ = probed
    for interval in (1000, 1):
        probe = TaskProbe(source, ("decoding(knorm)",), (0.5,), 0, compression_interval=interval)
        for batch in map(TaskBatch, ([0], [1], [2])):  # one example a batch
            source.run(batch, probe)
            prefills = probe.prefills[0]  # the batch's one example, every layer
            example = probe.examples[batch.index[0]]
            probe.after_batch(batch)
            if interval == 1000:
                assert (probe.ids[1, batch.index[0]] == probe.ids[0, batch.index[0]]).all()
                continue
            recompression = generation.Recompression(REGISTRY["decoding(knorm)"].for_run(compression_interval=1),
                                         n_kept(example.context, 0.5))
            room = example.asked[0].ids.shape[-1] + example.record.max_new_tokens
            cache = generation.Buffers.of([REGISTRY["decoding(knorm)"].compress(p, 0.5) for p in prefills], prefills, room)
            request = generation.Request(example.asked[0].ids, example.context, example.record.max_new_tokens,
                                         probe.stop, example.record.example)
            want = generation.greedy_alone(source.loaded.model, source.layers, cache, request, recompression)
            got = probe.ids[1, batch.index[0]]
            assert [int(token) - 1 for token in got if token] == want.ids
            assert probe.kept[1, batch.index[0]] == n_kept(example.context, 0.5) / example.context
            assert np.isnan(probe.survival[1, batch.index[0]]).all()
    answers = probe.arrays()["answers.npz"]
    assert answers["ids"].shape == probe.ids.shape and list(answers["press"]) == ["full", "decoding(knorm)"]
    np.testing.assert_array_equal(answers["ids"], probe.ids - 1)


def probe_of(model, path, records, presses, ratios, double=False, batch_size=1, interval=INTERVAL):
    source = TaskSource(RunConfig(str(model), str(path), batch_size=batch_size), "cpu", records, query_aware=False,
                        reads=(), windowed=False)
    source.start()
    if double:
        source.loaded.model.double()
    probe = TaskProbe(source, presses, ratios, 0, compression_interval=interval)
    for batch in source.batches(len(records)):
        source.run(batch, probe)
        probe.after_batch(batch)
    return source, probe


def test_many_questions_are_answered_from_one_compression_as_each_alone(tmp_path) -> None:
    """A record asking two questions (float64 tiny Llama, so no greedy tie can flip): each question's answer, the
    share of its own needle each cell kept and the full cache's attention on it equal those of a record asking that
    question alone of the same context (its own example, decoded in its own batch); the rows count every question."""
    from dataclasses import replace

    model = task_files.save_chat_decoder(tmp_path / "tiny-chat")
    rows = task_files.many_questions(task_files.records(count=2, max_new_tokens=6))
    path = task_files.write(tmp_path / "many.jsonl", rows)
    many = read_records(path)
    alone = [replace(part, example=2 * i + part.asked[0].index) for i, record in enumerate(many)
             for part in record.split()]
    presses, ratios = ("knorm", "snapkv", "adakv(snapkv)", "key_rerotation(knorm)"), (0.5, 0.75)
    source, probe = probe_of(model, path, many, presses, ratios, double=True)
    _, single = probe_of(model, path, alone, presses, ratios, double=True)
    assert probe.items == [(0, 0), (0, 1), (1, 0), (1, 1)] and single.items == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert [example.asked[1].needle.size > 0 for example in source.examples] == [True, True]
    assert not np.array_equal(source.examples[0].asked[0].needle, source.examples[0].asked[1].needle)
    np.testing.assert_array_equal(probe.ids, single.ids)
    assert len({tuple(row) for row in probe.ids.reshape(-1, probe.ids.shape[-1])}) > 3, "answers must differ to tell"
    np.testing.assert_array_equal(probe.survival, single.survival)
    np.testing.assert_allclose(probe.mass, single.mass, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(probe.kept, single.kept[:, ::2])
    examples = probe.tables()["task_examples.csv"]
    assert list(examples.columns[:4]) == ["press", "ratio", "example", "question"]
    assert list(zip(examples["example"], examples["question"]))[:4] == [(0, 0), (0, 1), (1, 0), (1, 1)]


STATE = ("ids", "survival", "kept", "bytes", "head_kept")


def batched(monkeypatch, model, path, records, presses, ratios, batch_size, interval=INTERVAL):
    """`probe_of` in float64 at `batch_size`, and the rows of every batch it decoded."""
    sizes = []
    original = batching.CacheBatch.of
    monkeypatch.setattr(batching.CacheBatch, "of", lambda *args: sizes.append(len(args[0])) or original(*args))
    _, probe = probe_of(model, path, records, presses, ratios, double=True, batch_size=batch_size, interval=interval)
    monkeypatch.setattr(batching.CacheBatch, "of", original)
    return probe, sizes


def test_examples_decoded_together_answer_as_one_at_a_time(tmp_path, monkeypatch) -> None:
    """--batch-size 3 against 1 (float64 tiny Llama, so no greedy tie can flip): five records — passkey ones
    answering in up to 5 tokens, niah ones in up to 9, two asking two questions among ones asking one — decoded
    three examples at a time (the last batch two) answer as one at a time: the same token ids (each row stopped at its
    own example's max_new_tokens), needles kept, shares, bytes; the full cache's attention on each needle to float64
    rounding; the tables alike."""
    model = task_files.save_chat_decoder(tmp_path / "tiny-chat")
    rows = (task_files.records(count=2, max_new_tokens=5)
            + task_files.many_questions(task_files.records(count=2, seed=1, max_new_tokens=9, task="niah_single_1"))
            + task_files.records(count=1, seed=2, max_new_tokens=9, task="niah_single_1"))
    path = task_files.write(tmp_path / "mixed.jsonl", rows)
    records = read_records(path)
    presses, ratios = ("streaming", "knorm", "snapkv", "adakv(snapkv)", "key_rerotation(knorm)"), (0.5, 0.75)
    one, one_sizes = batched(monkeypatch, model, path, records, presses, ratios, 1)
    three, three_sizes = batched(monkeypatch, model, path, records, presses, ratios, 3)
    cells = len(one.variants)
    # the first batch of 1: the guard's full cache alone (`kv.selfcheck`); then one batch an example, a row per question
    assert one_sizes == [1, cells, cells, 2 * cells, 2 * cells, cells]
    assert three_sizes == [1, (1 + 1 + 2) * cells, (2 + 1) * cells], three_sizes  # three examples, then the last two
    for name in STATE:
        np.testing.assert_array_equal(getattr(three, name), getattr(one, name), err_msg=name)
    np.testing.assert_allclose(three.mass, one.mass, rtol=1e-12, atol=1e-12)
    lengths = (three.ids > 0).sum(-1)  # (cells, items): tokens each answer produced
    passkey = [item for item, (position, _) in enumerate(three.items) if position < 2]
    assert lengths[:, passkey].max() == 5 and lengths.max() == 9, "each row stops at its own max_new_tokens"
    assert len({tuple(row) for row in three.ids.reshape(-1, three.ids.shape[-1])}) > 6, "answers must differ to tell"
    for name, table in three.tables().items():
        pd.testing.assert_frame_equal(table, one.tables()[name], check_exact=False, rtol=1e-12, obj=name)


def test_a_decoding_press_decodes_alone_beside_examples_decoded_together(tmp_path, monkeypatch) -> None:
    """decoding(knorm), paced every step, among presses decoding in a batch of three examples: its cells decode
    alone (`generation.greedy_alone` with recompression) and every answer equals the run one example at a time."""
    model = task_files.save_chat_decoder(tmp_path / "tiny-chat")
    rows = task_files.records(count=2, max_new_tokens=5) + task_files.records(count=2, seed=1, max_new_tokens=9,
                                                                              task="niah_single_1")
    path = task_files.write(tmp_path / "mixed.jsonl", rows)
    records = read_records(path)
    presses, ratios = ("knorm", "decoding(knorm)", "snapkv"), (0.5,)
    one, _ = batched(monkeypatch, model, path, records, presses, ratios, 1, interval=1)
    three, sizes = batched(monkeypatch, model, path, records, presses, ratios, 3, interval=1)
    assert sizes == [1, 3 * 3, 1 * 3], "the decoding press's cells are in no batch (the first: the guard's)"
    for name in STATE:
        np.testing.assert_array_equal(getattr(three, name), getattr(one, name), err_msg=name)
    decoding = three.variants.index(("decoding(knorm)", 0.5))
    assert not np.array_equal(three.ids[decoding], three.ids[0]), "paced every step, it must answer otherwise"
