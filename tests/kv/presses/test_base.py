"""The common pieces of every press: kvpress's n_kept, the per-key/value-head top-n selection, and the rows of a
compressed cache."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, Compressed, evict, full, n_kept, per_head
from spectra.kv.axes import AXES
from spectra.kv.presses.base import full_memory, row_bytes
from spectra.registry import PRESSES

from .conftest import make_prefill


def test_n_kept_truncates_the_float_product_as_kvpress_does() -> None:
    assert n_kept(100, 0.9) == 9, "100·(1 − 0.9) = 9.999…98 truncates to 9"
    assert n_kept(256, 0.3) == 179 and n_kept(256, 0.5) == 128 and n_kept(1024, 0.75) == 256
    assert n_kept(3, 0.9) == 1, "at least one token is kept"
    assert n_kept(10, 1.0) == 0


def test_evict_keeps_the_top_scores_of_each_key_value_head_in_position_order() -> None:
    prefill, arrays = make_prefill(length=20)
    scores = torch.from_numpy(np.random.default_rng(1).standard_normal((2, 20)))
    compressed = evict(prefill, scores, 7)
    for head in range(2):
        expected = np.sort(np.argsort(-scores[head].numpy())[:7])
        np.testing.assert_array_equal(compressed.kept[head].numpy(), expected)
    assert not torch.equal(compressed.kept[0], compressed.kept[1]), "each key/value head chooses its own tokens"
    keys, values = compressed.rows(prefill.key, prefill.value)
    for head in range(2):
        np.testing.assert_array_equal(keys[head].numpy(), arrays["k"][head, compressed.kept[head].numpy()])
        np.testing.assert_array_equal(values[head].numpy(), arrays["v"][head, compressed.kept[head].numpy()])
    assert compressed.saved == pytest.approx(1 - 7 / 20)


def test_the_full_cache_is_every_row_and_a_transform_must_give_its_rows() -> None:
    prefill, _ = make_prefill(length=12)
    keys, values = full(prefill).rows(prefill.key, prefill.value)
    assert torch.equal(keys, prefill.key) and torch.equal(values, prefill.value) and full(prefill).saved == 0
    with pytest.raises(ValueError, match="must give its keys and values"):
        Compressed(None, 0.5, key=prefill.key)
    mixed = Compressed(None, 0.5, key=prefill.key[:, :3], value=prefill.value[:, :3])
    assert mixed.rows(prefill.key, prefill.value)[0].shape == (2, 3, 8)


def test_group_mean_averages_the_query_heads_of_each_key_value_head() -> None:
    prefill, _ = make_prefill(length=12)
    per_head = torch.arange(6.0)[:, None].expand(6, 4)
    np.testing.assert_array_equal(prefill.group_mean(per_head).numpy(), [[1.0] * 4, [4.0] * 4])
    assert prefill.groups == 3 and prefill.kv_heads == 2 and prefill.length == 12 and prefill.head_dim == 8


def test_every_press_is_registered_once_with_a_summary() -> None:
    assert all(press.summary for press in REGISTRY.values())


def test_the_literal_summaries_name_the_settings_the_presses_run_with() -> None:
    """A summary is a literal (--help reads it without importing the press), so the setting it names is written twice:
    each must be the one the press runs with."""
    from spectra.kv.presses import block, chunk, chunkkv, eviction

    assert f"last {eviction.SnapKV.window} queries" in REGISTRY["snapkv"].summary
    assert f"block of {block.BLOCK}" in REGISTRY["block"].summary
    assert f"each {chunk.CHUNK}-token chunk" in REGISTRY["chunk"].summary
    assert f"chunks of {chunkkv.CHUNK} tokens" in REGISTRY["chunkkv"].summary
    assert f"chunks of {chunkkv.GATED} tokens, spiky ones cut to their {chunkkv.SPIKY} best" in \
        REGISTRY["entropy_gated_chunkkv"].summary


#: where kvpress 0.5.5 lives when it is installed beside the project (its own venv: it pins transformers < 5.3)
KVPRESS_VENV = Path(os.environ.get("KVPRESS_VENV", "/work/kv"))


def kvpress_classes() -> set[str] | None:
    """The class names kvpress's presses define, read from its source (importing it needs its own venv), or None."""
    spec = importlib.util.find_spec("kvpress")
    folders = [Path(spec.origin).parent / "presses"] if spec is not None and spec.origin else []
    folders += sorted(KVPRESS_VENV.glob("lib/python3*/site-packages/kvpress/presses"))
    for folder in folders:
        if folder.is_dir():
            return {node.name for path in folder.glob("*.py") for node in ast.parse(path.read_text()).body
                    if isinstance(node, ast.ClassDef)}
    return None


def test_each_peer_is_the_class_the_benchmarks_run_against_spectra() -> None:
    """benchmarks/kvpress_tasks.py builds kvpress 0.5.5's press for each spectra name it compares (its mappings, which
    ran against kvpress in benchmarks/RESULTS.md): the declared peers say the same."""
    tree = ast.parse((Path(__file__).parents[3] / "benchmarks" / "kvpress_tasks.py").read_text())
    mappings = {target.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets
                if isinstance(target, ast.Name) and target.id in ("KVPRESS_NAMES", "WRAPPERS")}
    built = {**mappings["KVPRESS_NAMES"], **mappings["WRAPPERS"]}
    assert len(built) >= 14
    assert {name: PRESSES.facts(name).get("peer") for name in built} == built


@pytest.mark.skipif(kvpress_classes() is None, reason="kvpress 0.5.5's source is not installed here")
def test_each_peer_is_a_class_of_kvpress() -> None:
    classes = kvpress_classes()
    peers = {name: entry.facts["peer"] for name, entry in PRESSES.entries().items() if entry.facts.get("peer")}
    assert len(peers) >= 25 and {name: peer for name, peer in peers.items() if peer not in classes} == {}


def test_memory_counts_rows_at_the_caches_dtype_unless_the_press_counted_it() -> None:
    prefill, _ = make_prefill(length=20)  # float64, d = 8: a row of one key/value head is 2 × 8 × 8 bytes
    assert evict(prefill, torch.zeros(2, 20), 7).memory(prefill).tolist() == [7 * 128] * 2
    assert full(prefill).memory(prefill).tolist() == [20 * 128] * 2
    assert full_memory(prefill) == 20 * 128 and row_bytes(prefill) == 128
    mixed = Compressed(None, 0.5, key=prefill.key[:, :3], value=prefill.value[:, :3])
    assert mixed.memory(prefill).tolist() == [3 * 128] * 2
    counted = Compressed(None, 0.5, key=prefill.key, value=prefill.value, stored=torch.tensor([5, 6]))
    assert counted.memory(prefill).tolist() == [5, 6]


def test_every_press_declares_an_axis() -> None:
    axes = {name: press.axis for name, press in REGISTRY.items()}
    assert set(axes.values()) <= set(AXES)
    assert axes["think"] == "channels" and axes["lowrank"] == "rank" and axes["kivi2"] == "bits"
    assert axes["snapkv"] == "tokens"


def test_per_head_keeps_each_heads_positions_padded_with_its_last(prefill) -> None:
    prefilled, _ = prefill
    keep = np.zeros((2, 100), dtype=bool)
    keep[0, [3, 50, 99]] = True
    keep[1, [0, 7, 8, 9, 40, 41]] = True
    part = per_head(prefilled, torch.from_numpy(keep))
    assert part.kept.tolist() == [[3, 50, 99, 99, 99, 99], [0, 7, 8, 9, 40, 41]]
    assert part.valid.tolist() == [[True] * 3 + [False] * 3, [True] * 6]
    assert part.counts().tolist() == [3, 6] and part.saved == pytest.approx(1 - 9 / 200)
    np.testing.assert_array_equal(part.kept_mask(100).numpy(), keep)
    even = per_head(prefilled, torch.from_numpy(np.repeat(keep[1:], 2, axis=0)))
    assert even.valid is None and even.counts().tolist() == [6, 6], "equal counts need no mask"
    with pytest.raises(ValueError, match="at least one"):
        per_head(prefilled, torch.zeros(2, 100, dtype=torch.bool))
