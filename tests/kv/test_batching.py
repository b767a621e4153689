"""Cells decoded together as one batch against each cell decoded alone (`generation.greedy_alone`, itself held equal to
`model.generate` and to dense forwards in test_generation.py): every press that compresses once, at two ratios, in
one batch, with stop tokens that end some rows early (so the batch sheds them) — the same answers, and the full
cache's attention on the needle the same to float64 rounding. Float64 tiny Llama with grouped-query attention, so a
greedy tie (the one way a batch may change an answer) cannot happen by rounding. Also the memory arithmetic and the
layout: padding hidden, room refused beyond its end."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spectra import models, sliding
from spectra.kv import batching, generation, gradient, prefill, reconstruction
from spectra.kv.cell import Cells
from spectra.kv.generation import Request
from spectra.registry import PRESSES

import tiny

CONTEXT, QUESTION, NEW = 96, 6, 8
#: every press named alone that compresses once after the prefill (decoding(…) decodes alone; duo, headbudget and
#: mixed take a file, which test_cell.py and the kind's tests give them)
PRESSES_ALONE = [name for name in PRESSES.bare() if name not in PRESSES.having("decodes")]


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory):
    path = tiny.save_decoder(tmp_path_factory.mktemp("models") / "gqa-llama", heads=6, kv_heads=2, hidden=48)
    loaded = models.load(str(path), device="cpu", lm_head=True)
    loaded.model.double()
    ids = torch.randint(3, len(loaded.tokenizer), (CONTEXT + QUESTION,), generator=torch.Generator().manual_seed(5))
    repetition = reconstruction.Repetition.of(loaded.tokenizer)
    reads = ("received", "query_pre", "reconstruction", "composition")
    found = prefill.exact(loaded.model, loaded.layers, ids[:CONTEXT], 0, 0, reads, repetition=repetition)
    scores = gradient.scores(loaded.model, loaded.layers, [part.key for part in found],
                             [part.value for part in found], ids[:CONTEXT], repetition, 0)  # kvgrad's pass
    return loaded, ids, [replace(part, passes={**part.passes, "gradient": scores}) for part in found]


def compressed_cells(prefills, presses, ratios):
    cells = list(Cells(presses + ["adakv(snapkv)"], ratios, layers=len(prefills)).of(CONTEXT, 0, 0))
    for cell in cells:
        for layer in prefills:
            cell.compress(layer)
    return cells


def alone(loaded, ids, prefills, cell, stop, needle=None):
    cache = cell.buffers(prefills, QUESTION + NEW)
    request = Request(ids[CONTEXT:], CONTEXT, NEW, stop, 0, needle)
    return generation.greedy_alone(loaded.model, loaded.layers, cache, request)


def test_every_press_answers_in_a_batch_as_alone(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    cells = compressed_cells(prefills, PRESSES_ALONE, (0.3, 0.7))
    free = [alone(loaded, ids, prefills, cell, set()).ids for cell in cells]
    assert len({tuple(answer) for answer in free}) > 3, "the presses must change answers for the test to tell"
    stop = {answer[2] for answer in free[::3]}  # most rows end early, at different steps: the batch sheds rows
    want = [alone(loaded, ids, prefills, cell, stop).ids for cell in cells]
    early = sum(len(answer) < NEW for answer in want)
    assert len(want) // 2 < early < len(want) and len({len(answer) for answer in want}) > 2
    batch = batching.CacheBatch.of([cell.parts for cell in cells], prefills, QUESTION + NEW)
    requests = [Request(ids[CONTEXT:], CONTEXT, NEW, stop, 0)] * len(cells)
    got = batching.greedy_batch(loaded.model, loaded.layers, batch, requests)
    assert [decoded.ids for decoded in got] == want


def test_cells_starting_at_different_positions_answer_in_a_batch_as_alone(gqa_llama) -> None:
    """key_rerotation's cells decode from m, the others from L: one batch, each row at its own positions."""
    loaded, ids, prefills = gqa_llama
    cells = compressed_cells(prefills, ["knorm", "key_rerotation(knorm)", "key_rerotation(snapkv)"], (0.3, 0.7))
    starts = [cell.start for cell in cells]
    assert starts[:3] == [CONTEXT] * 3 and starts[3:7] == [67, 28, 67, 28], starts
    want = []
    for cell in cells:
        cache = cell.buffers(prefills, QUESTION + NEW)
        want.append(generation.greedy_alone(loaded.model, loaded.layers, cache,
                                            Request(ids[CONTEXT:], cell.start, NEW, set(), 0)).ids)
    at_context = [alone(loaded, ids, prefills, cell, set()).ids for cell in cells[3:7]]
    assert at_context != want[3:7], "the start must change answers for the test to tell"
    stop = {want[3][2], want[4][1]}  # rows end early: the batch sheds them with their starts
    requests = [Request(ids[CONTEXT:], cell.start, NEW, stop, 0) for cell in cells]
    want = [generation.greedy_alone(loaded.model, loaded.layers, cell.buffers(prefills, QUESTION + NEW), request).ids
            for cell, request in zip(cells, requests)]
    batch = batching.CacheBatch.of([cell.parts for cell in cells], prefills, QUESTION + NEW)
    got = batching.greedy_batch(loaded.model, loaded.layers, batch, requests)
    assert [decoded.ids for decoded in got] == want


def test_the_needle_mass_is_measured_on_its_row(gqa_llama) -> None:
    loaded, ids, prefills = gqa_llama
    cells = compressed_cells(prefills, ["knorm", "snapkv"], (0.5,))
    needle = torch.tensor([3, 40, 41, 90])
    want = alone(loaded, ids, prefills, cells[0], set(), needle).needle_mass
    order = [1, 0, 2, 3]  # the full cache's cell in the second row
    batch = batching.CacheBatch.of([cells[i].parts for i in order], prefills, QUESTION + NEW)
    requests = [Request(ids[CONTEXT:], CONTEXT, NEW, set(), 0, needle if i == 0 else None) for i in order]
    got = batching.greedy_batch(loaded.model, loaded.layers, batch, requests)
    assert got[1].needle_mass is not None and all(decoded.needle_mass is None for i, decoded in enumerate(got) if i != 1)
    assert torch.allclose(got[1].needle_mass, want, atol=1e-12, rtol=0)


def test_eviction_rows_are_read_in_place_and_new_tokens_seen_causally(gqa_llama) -> None:
    _, _, prefills = gqa_llama
    cells = compressed_cells(prefills, ["knorm"], (0.5,))  # full (96 rows), knorm (48), adakv(snapkv) (per head)
    batch = batching.CacheBatch.of([cell.parts for cell in cells], prefills, 5)
    shared = batch.shared[0]
    assert shared.key is prefills[0].key and shared.value is prefills[0].value  # read in place, not copied
    assert batch.filled[0] == 0 and batch.keys[0].shape == (3, 2, 5, 8)
    for row, cell in enumerate(cells):
        assert torch.equal(shared.kept[row], cell.parts[0].kept_mask(CONTEXT))
    assert shared.kept[0].all() and int(shared.kept[1].sum()) == 2 * 48
    batch.extend(0, *(torch.zeros(3, 2, 3, 8, dtype=torch.float64),) * 2)
    mask = batch.mask(0, 3, 6)  # (B, H, n, S): the new tokens, causally
    assert torch.equal(mask, torch.ones(3, 3, dtype=torch.bool).tril().expand(3, 6, 3, 3))
    batch.keep(torch.tensor([2, 0]))
    assert torch.equal(batch.shared[0].kept, shared.kept[[2, 0]])
    with pytest.raises(ValueError, match="holds 5 columns; 6 asked"):
        batch.extend(0, *(torch.zeros(2, 2, 3, 8, dtype=torch.float64),) * 2)


def test_rows_not_the_prefills_own_are_copied_and_padding_hidden(gqa_llama) -> None:
    """ThinK's pruned keys are its own rows: copied, padded to the widest; the eviction rows beside them keep none."""
    _, _, prefills = gqa_llama
    cells = compressed_cells(prefills, ["think", "knorm"], (0.5,))  # full, think (96 own rows), knorm (48), adakv
    assert cells[1].parts[0].key is not None and cells[2].parts[0].key is None
    batch = batching.CacheBatch.of([cell.parts for cell in cells], prefills, 5)
    assert batch.filled[0] == CONTEXT and batch.keys[0].shape == (4, 2, CONTEXT + 5, 8)
    assert torch.equal(batch.keys[0][1, :, :CONTEXT], cells[1].parts[0].key)
    assert not batch.seen[0][[0, 2, 3], :, :CONTEXT].any() and batch.seen[0][1, :, :CONTEXT].all()
    assert not batch.shared[0].kept[1].any() and batch.shared[0].kept[0].all()
    batch.extend(0, *(torch.zeros(4, 2, 3, 8, dtype=torch.float64),) * 2)
    mask = batch.mask(0, 3, 6)
    assert torch.equal(mask[:, :, :, CONTEXT:], torch.ones(3, 3, dtype=torch.bool).tril().expand(4, 6, 3, 3))


def test_several_prefills_are_copied(gqa_llama) -> None:
    """Rows of two examples' prefills (or of a sliding-window layer) hold their context rows in the batch itself,
    each hidden past its own."""
    _, _, prefills = gqa_llama
    other = [replace(part, key=part.key.clone(), value=part.value.clone()) for part in prefills]
    cells = compressed_cells(prefills, ["knorm"], (0.5,))
    batch = batching.CacheBatch.of([cell.parts for cell in cells], [prefills, other, prefills], 5)
    assert batch.shared[0] is None and batch.filled[0] == CONTEXT
    assert batch.seen[0][0, :, :CONTEXT].all() and not batch.seen[0][1, :, 48:CONTEXT].any()
    assert batch.seen[0][1, :, :48].all()


def test_the_memory_of_a_group() -> None:
    rows = [[10, 20], [6, 4]]  # two cells' rows in two layers
    assert batching.group_bytes(rows, 3, 100) == 2 * ((10 + 3) + (20 + 3)) * 100
    assert batching.batch_row_bytes(3, 64, 64, 4) == 3 * (128 * 4 + 1)


def test_rows_answering_different_questions_answer_as_each_alone(gqa_llama) -> None:
    """(question, cell) pairs as rows of one batch, as a record asking several questions is answered: questions of
    6, 3 and 2 tokens (the shorter left-padded, the padding hidden), cells starting at L or at m
    (key_rerotation) — each row's answer and the full cache's attention on each question's needle are those of
    `generation.greedy_alone` answering that question alone from the cell's cache (float64)."""
    loaded, ids, prefills = gqa_llama
    cells = compressed_cells(prefills, ["knorm", "key_rerotation(snapkv)"], (0.3, 0.7))
    questions = [ids[CONTEXT:], ids[CONTEXT + 3:], ids[CONTEXT + 4:]]
    needles = [torch.tensor([3, 40, 41]), torch.tensor([7, 8]), torch.tensor([90])]
    pairs = [(j, cell) for j in range(3) for cell in cells]
    def requests(stop):
        return [Request(questions[j], cell.start, NEW, stop, 0, needles[j] if cell.compressor is None else None)
                for j, cell in pairs]

    want = [generation.greedy_alone(loaded.model, loaded.layers, cell.buffers(prefills, QUESTION + NEW), request)
            for (_, cell), request in zip(pairs, requests(set()))]
    assert len({tuple(answer.ids) for answer in want}) > 6, "the questions must change answers for the test to tell"
    stop = {want[1].ids[2], want[8].ids[1]}
    want = [generation.greedy_alone(loaded.model, loaded.layers, cell.buffers(prefills, QUESTION + NEW), request)
            for (_, cell), request in zip(pairs, requests(stop))]
    batch = batching.CacheBatch.of([cell.parts for _, cell in pairs], prefills, QUESTION + NEW)
    full = {row: needles[j] for row, (j, cell) in enumerate(pairs) if cell.compressor is None}
    got = batching.greedy_batch(loaded.model, loaded.layers, batch, requests(stop))
    assert [decoded.ids for decoded in got] == [decoded.ids for decoded in want]
    assert sorted(full) == [0, 7, 14]  # the full cache: the first of 7 cells, once per question
    for row in range(len(pairs)):
        if row in full:
            torch.testing.assert_close(got[row].needle_mass, want[row].needle_mass, rtol=1e-12, atol=1e-12)
        else:
            assert got[row].needle_mass is None


def test_cells_of_two_examples_answer_in_a_batch_as_alone(gqa_llama) -> None:
    """Cells of two examples (contexts of 96 and 71 tokens, each its own prefill, question, start, needle, index
    and max_new_tokens, 8 and 3) as rows of one batch, as `spectra evaluate --batch-size 2` decodes them: each row's
    answer is the one `generation.greedy_alone` gives its cell alone, stopping at its own example's max_new_tokens, and
    the full caches' attention on their needles the same to float64 rounding."""
    loaded, ids, prefills = gqa_llama
    other = torch.randint(3, len(loaded.tokenizer), (71 + 4,), generator=torch.Generator().manual_seed(9))
    found = prefill.exact(loaded.model, loaded.layers, other[:71], 0, 1)
    examples = [(prefills, ids[CONTEXT:], NEW, 0, torch.tensor([3, 40, 41])),
                (found, other[71:], 3, 1, torch.tensor([5, 60]))]
    cells = []
    for owner, (own, _, _, index, _) in enumerate(examples):
        made = list(Cells(["knorm", "snapkv", "key_rerotation(knorm)"], (0.3, 0.7), layers=len(own)).of(
            own[0].key.shape[-2], 0, index))
        for cell in made:
            for layer in own:
                cell.compress(layer)
        cells += [(owner, cell) for cell in made]
    cells = cells[::2] + cells[1::2]  # the two examples' rows interleaved
    room = QUESTION + NEW

    def request(owner, cell, stop):
        _, question, new, index, needle = examples[owner]
        return Request(question, cell.start, new, stop, index, needle if cell.compressor is None else None)

    def alone(owner, cell, stop):
        return generation.greedy_alone(loaded.model, loaded.layers, cell.buffers(examples[owner][0], room),
                                       request(owner, cell, stop))

    free = [alone(owner, cell, set()) for owner, cell in cells]
    stop = {free[2].ids[1], free[5].ids[2]}
    want = [alone(owner, cell, stop) for owner, cell in cells]
    assert len({tuple(answer.ids) for answer in want}) > 6, "the cells must answer otherwise for the test to tell"
    assert {len(answer.ids) for owner, answer in zip([owner for owner, _ in cells], want) if owner == 1} <= {1, 2, 3}
    batch = batching.CacheBatch.of([cell.parts for _, cell in cells], [examples[owner][0] for owner, _ in cells], room)
    full = {row: examples[owner][4] for row, (owner, cell) in enumerate(cells) if cell.compressor is None}
    requests = [request(owner, cell, stop) for owner, cell in cells]
    got = batching.greedy_batch(loaded.model, loaded.layers, batch, requests)
    assert [decoded.ids for decoded in got] == [decoded.ids for decoded in want]
    assert max(len(decoded.ids) for decoded in want) == NEW and len(full) == 2
    for row in full:
        torch.testing.assert_close(got[row].needle_mass, want[row].needle_mass, rtol=1e-12, atol=1e-12)
    batch = batching.CacheBatch.of([cell.parts for _, cell in cells], [examples[owner][0] for owner, _ in cells], room)
    with pytest.raises(ValueError, match="2 requests for a batch of 14 rows"):
        batching.greedy_batch(loaded.model, loaded.layers, batch, requests[:2])
    with pytest.raises(ValueError, match="2 examples' prefills for a batch of 3 cells"):
        batching.CacheBatch.of([cell.parts for _, cell in cells[:3]], [prefills, found], room)


def test_local_layers_are_banded_per_key_value_head() -> None:
    """A local layer whose key/value heads keep different rows (`--local-layers compress`) or whose window reads rows
    at other positions (`kvpress`: `Compressed.window_positions`): each head's columns are seen by the queries whose
    window holds their position, in a batch as in a cache decoded alone (`generation.Buffers`), and both answer
    alike (float64, two key/value heads)."""
    from spectra.config import LocalLayers
    from spectra.kv.cell import Cell

    model = tiny.gemma3(window=8, dtype=torch.float64, kv_heads=2)
    generator = torch.Generator().manual_seed(4)
    context, question = torch.randint(3, 128, (40,), generator=generator), torch.randint(3, 128, (5,),
                                                                                          generator=generator)
    prefills = prefill.exact(model, 3, context, 0, 0, ())
    for mode in (LocalLayers.COMPRESS, LocalLayers.KVPRESS):
        cell = Cell("knorm", 0.5, PRESSES["knorm"], 40, 0, 0, mode)
        for part in prefills:
            cell.compress(part)
        kept = [part.kept if part.window_positions is None else part.window_positions for part in cell.parts[:2]]
        layer = next((layer for layer, at in enumerate(kept) if not torch.equal(at[0], at[1])), 0)
        at = kept[layer]
        assert mode == LocalLayers.KVPRESS or not torch.equal(at[0], at[1])  # the heads keep different rows
        batch = batching.CacheBatch.of([cell.parts], prefills, 5 + 6)
        batch.at = torch.arange(40, 43)[None]
        batch.extend(layer, *(torch.zeros(1, 2, 3, 16, dtype=torch.float64),) * 2)
        queries = torch.arange(40, 43)[:, None]
        shared = batch.shared[layer]
        if mode == LocalLayers.COMPRESS:  # the prefill's own rows: read in place, each head its kept positions
            held = torch.arange(40).expand(2, -1)
            window = (held[:, None, :] <= queries) & (held[:, None, :] > queries - 8)
            kept = torch.zeros(2, 40, dtype=torch.bool).scatter_(1, at, True)
            assert torch.equal(shared.kept[0], kept)
            assert torch.equal(shared.kept[0][:, None, :] & sliding.band(batch.at[0], torch.arange(40), 8)[None],
                               kept[:, None, :] & window)
            rows = torch.arange(40, 43).expand(2, -1)
        else:  # kvpress's rows moved to other positions: copied, each at its window's position
            assert shared is None
            rows = torch.cat([at, torch.arange(40, 43).expand(2, -1)], dim=-1)  # (H_kv, columns)
        want = (rows[:, None, :] <= queries) & (rows[:, None, :] > queries - 8)
        assert torch.equal(batch.mask(layer, 3, 4)[0], want.repeat_interleave(2, dim=0))
        request = Request(question, 40, 6, set(), 0)
        alone = generation.greedy_alone(model, 3, cell.buffers(prefills, 5 + 6), request)
        together = batching.greedy_batch(model, 3, batching.CacheBatch.of([cell.parts], prefills, 5 + 6), [request])
        assert together[0].ids == alone.ids


def test_settled_rows_stop_where_their_answers_settle(gqa_llama) -> None:
    """`Request.settled` (`--stop-answered`) ends a row as soon as it holds for the tokens produced so far: each row's
    answer, in a batch and alone, is its free answer cut right after the first prefix that settles it (rows settle
    at different steps, so the batch sheds them)."""
    loaded, ids, prefills = gqa_llama
    cells = compressed_cells(prefills, ["knorm", "snapkv", "streaming", "tova"], (0.3, 0.7))
    free = [alone(loaded, ids, prefills, cell, set()).ids for cell in cells]
    marks = {answer[3] for answer in free[::2]}

    def settled(produced) -> bool:
        return any(token in marks for token in produced)

    def cut(answer):
        first = next((at for at, token in enumerate(answer) if token in marks), len(answer) - 1)
        return answer[:first + 1]

    want = [cut(answer) for answer in free]
    assert len({len(answer) for answer in want}) > 2 and sum(len(answer) < NEW for answer in want) > len(want) // 2
    requests = [Request(ids[CONTEXT:], CONTEXT, NEW, set(), 0, settled=settled)] * len(cells)
    assert [generation.greedy_alone(loaded.model, loaded.layers, cell.buffers(prefills, QUESTION + NEW),
                                    request).ids for cell, request in zip(cells, requests)] == want
    batch = batching.CacheBatch.of([cell.parts for cell in cells], prefills, QUESTION + NEW)
    assert [decoded.ids for decoded in batching.greedy_batch(loaded.model, loaded.layers, batch, requests)] == want
