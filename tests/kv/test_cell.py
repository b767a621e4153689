"""The cell against computations written here: the rows an eviction press keeps (knorm: numpy norms), counted per
head, in bytes (rows × (key + value dimensions) × 4 bytes of float32) and as the share of a needle's positions kept
(sets); the full cache keeping everything; a press that compresses while decoding leaving the prefill whole and
counting its target; and the grid making each press once per run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from spectra.kv import cell as cells_module
from spectra.kv.cell import FULL, Cell, Cells
from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, Prefill, n_kept

LAYERS, HEADS, KV_HEADS, LENGTH, DIM, WINDOW = 2, 4, 2, 40, 8, 6
#: bytes of one cached token of one key/value head: its key and value, float32
ROW = 2 * DIM * 4
NEEDLE = np.array([3, 4, 5, 30])


def prefills(seed: int = 0) -> list[Prefill]:
    """LAYERS layers of a random float32 prefill of LENGTH tokens (keys of varied norms)."""
    rng = np.random.default_rng(seed)
    found = []
    for layer in range(LAYERS):
        key = rng.standard_normal((KV_HEADS, LENGTH, DIM)) * rng.uniform(0.2, 3.0, (KV_HEADS, LENGTH, 1))
        value = rng.standard_normal((KV_HEADS, LENGTH, DIM))
        window = rng.uniform(size=(HEADS, WINDOW, LENGTH))
        as_torch = lambda array: torch.tensor(array, dtype=torch.float32)  # noqa: E731
        found.append(Prefill(layer, as_torch(rng.standard_normal((HEADS, WINDOW, DIM))), as_torch(key),
                             as_torch(value), None, as_torch(window / window.sum(-1, keepdims=True)), DIM ** -0.5, 7,
                             3, passes={"received": as_torch(rng.uniform(size=(HEADS, LENGTH)))}))
    return found


def filled(cell: Cell, layers: list[Prefill]) -> Cell:
    for prefill in layers:
        cell.compress(prefill)
    return cell


def test_an_eviction_cell_counts_its_rows_bytes_and_the_needle() -> None:
    layers = prefills()
    cell = filled(Cell("knorm", 0.75, REGISTRY["knorm"], LENGTH, 7, 3), layers)
    kept = n_kept(LENGTH, 0.75)
    assert kept == 10 and not cell.decodes and cell.recompression() is None and cell.target is None
    np.testing.assert_array_equal(cell.counts(), np.full((LAYERS, KV_HEADS), 10.0))
    np.testing.assert_array_equal(cell.kept_share(), np.full((LAYERS, KV_HEADS), 0.25))
    assert [cell.memory(layer).tolist() for layer in range(LAYERS)] == [[10 * ROW] * KV_HEADS] * LAYERS
    assert cell.bytes() == LAYERS * KV_HEADS * 10 * ROW and cell.full_bytes() == LAYERS * KV_HEADS * LENGTH * ROW
    assert cell.saved() == pytest.approx(0.75)
    want = []
    for prefill in layers:
        norms = np.linalg.norm(prefill.key.double().numpy(), axis=-1)
        chosen = [set(np.argsort(row, kind="stable")[:10].tolist()) for row in norms]
        want.append([len(set(NEEDLE.tolist()) & heads) / len(NEEDLE) for heads in chosen])
    np.testing.assert_array_equal(cell.survival(NEEDLE), want)
    cache = cell.buffers(layers, room=5)
    for layer, prefill in enumerate(layers):
        rows = cell.parts[layer].kept
        assert cache.lengths[layer] == 10 and cache.keys[layer].shape[-2] == 15
        assert torch.equal(cache.keys[layer][:, :10], prefill.key.gather(1, rows[..., None].expand(-1, -1, DIM)))


def test_the_full_cell_keeps_every_row() -> None:
    layers = prefills()
    cell = filled(next(Cells(["knorm"], [0.5]).of(LENGTH, 7, 3)), layers)
    assert cell.press == FULL and cell.compressor is None and cell.recompression() is None
    np.testing.assert_array_equal(cell.kept_share(), np.ones((LAYERS, KV_HEADS)))
    assert cell.bytes() == cell.full_bytes() == LAYERS * KV_HEADS * LENGTH * ROW and cell.saved() == 0
    np.testing.assert_array_equal(cell.survival(NEEDLE), np.ones((LAYERS, KV_HEADS)))
    assert np.isnan(cell.survival(np.array([], dtype=np.int64))).all(), "no needle: nothing to survive"


def test_a_cell_that_decodes_leaves_the_prefill_whole_and_counts_its_target() -> None:
    """decoding(knorm): the cache after the prefill is the whole one; its kept share and bytes are its target's (the
    rows it keeps the cache at while decoding, those knorm keeps at the ratio); its rows are no positions once decoding
    compresses, so no needle survival; it decodes by a recompression at that target, paced by the run's interval."""
    layers = prefills()
    grid = Cells(["knorm", "decoding(knorm)"], [0.75], compression_interval=3)
    eviction, decoding_cell = [filled(cell, layers) for cell in list(grid.of(LENGTH, 7, 3))[1:]]
    assert decoding_cell.decodes and decoding_cell.target == n_kept(LENGTH, 0.75) == 10
    for part in decoding_cell.parts:
        np.testing.assert_array_equal(part.kept.numpy(), np.tile(np.arange(LENGTH), (KV_HEADS, 1)))
    np.testing.assert_array_equal(decoding_cell.counts(), eviction.counts())
    assert decoding_cell.bytes() == eviction.bytes() == LAYERS * KV_HEADS * 10 * ROW
    assert decoding_cell.full_bytes() == eviction.full_bytes()
    assert np.isnan(decoding_cell.survival(NEEDLE)).all()
    recompression = decoding_cell.recompression()
    assert recompression is not None and recompression.target == 10 and recompression.press.interval == 3
    assert (recompression.seed, recompression.index) == (7, 3) and recompression.press is grid.presses["decoding(knorm)"]
    assert decoding_cell.buffers(layers, room=2).lengths == [LENGTH] * LAYERS


def test_a_cache_mixed_along_the_sequence_keeps_no_positions() -> None:
    """linformer's rows are mixtures of tokens (E·K, F·V): no needle survival; it stores its rows at float32."""
    cell = filled(Cell("linformer", 0.75, REGISTRY["linformer"], LENGTH, 7, 3), prefills())
    assert cell.parts[0].kept is None and np.isnan(cell.survival(NEEDLE)).all()
    rows = cell.parts[0].key.shape[-2]
    np.testing.assert_array_equal(cell.counts(), np.full((LAYERS, KV_HEADS), float(rows)))
    assert rows < LENGTH and cell.bytes() == LAYERS * KV_HEADS * rows * ROW


def test_layers_come_in_order() -> None:
    layers = prefills()
    with pytest.raises(ValueError, match="layer 1 reached the cell after 0 layers"):
        Cell("knorm", 0.5, REGISTRY["knorm"], LENGTH, 7, 3).compress(layers[1])


def test_the_grid_builds_each_press_once_and_fresh_cells_per_example(monkeypatch) -> None:
    made = []
    real = cells_module.run_presses
    monkeypatch.setattr(cells_module, "run_presses", lambda names, **settings: made.append(names) or real(names,
                                                                                                         **settings))
    grid = Cells(["knorm", "loki"], [0.5, 0.25])
    assert grid.variants == [(FULL, 0.0), ("knorm", 0.5), ("knorm", 0.25), ("loki", 0.5), ("loki", 0.25)]
    assert len(grid) == 5 and list(grid) == grid.variants and made == [["knorm", "loki"]]
    assert grid.presses["knorm"] is REGISTRY["knorm"]
    assert grid.presses["loki"] is not REGISTRY["loki"], "a calibrating press's fit is the run's own"
    first, second = list(grid.of(LENGTH, 7, 3)), list(grid.of(50, 7, 4))
    assert [cell.compressor for cell in first] == [cell.compressor for cell in second]
    assert [(cell.press, cell.ratio) for cell in first] == grid.variants and made == [["knorm", "loki"]]
    assert first[3].compressor is grid.presses["loki"] and (second[0].context, second[0].index) == (50, 4)
    assert all(not cell.parts for cell in second)


def test_a_cell_starts_decoding_where_its_press_renumbered_the_context() -> None:
    """An eviction press decodes from the context's length; key_rerotation from its m kept tokens, in every layer."""
    layers = prefills()
    knorm = filled(Cell("knorm", 0.75, REGISTRY["knorm"], LENGTH, 7, 3), layers)
    assert knorm.start == LENGTH
    rotary = [replace(prefill, key_pre=prefill.key, rope=lambda positions: (
        torch.ones(len(positions), DIM), torch.zeros(len(positions), DIM))) for prefill in layers]  # R(p) = I
    cell = filled(Cell("key_rerotation(knorm)", 0.75, REGISTRY["key_rerotation(knorm)"], LENGTH, 7, 3), rotary)
    assert cell.start == n_kept(LENGTH, 0.75) == 10 and cell.kept_share().max() == 0.25
    parts = [cell.parts[0], replace(cell.parts[1], start=None)]
    with pytest.raises(SpectraError, match="sliding-window layers cannot follow"):  # a local layer's, unrenumbered
        cells_module.start(parts, LENGTH)
