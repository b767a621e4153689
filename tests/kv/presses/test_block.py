"""`block(<rowscorer>)` against a numpy formula written here from kvpress 0.5.5's BlockPress: the first n_kept tokens,
then after each block of 128 the n_kept best of the survivors (in the order topk left them) and the block's rows,
scored as if they were the whole context."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, ScorerPress, n_kept
from spectra.kv.presses.block import block_keep

from .conftest import make_prefill
from .test_chunk import ROWSCORERS, numpy_keydiff, numpy_knorm, rows_prefill


def numpy_block(keys: np.ndarray, ratio: float, score, block: int = 128) -> np.ndarray:
    """(H_kv, n_kept) ascending: per head, the survivors of scoring, block after block, the kept rows then the
    block's (scores distinct: no ties)."""
    heads, length, _ = keys.shape
    keep, block = n_kept(length, ratio), min(block, length)
    kept = []
    for head in range(heads):
        mine = np.arange(keep)
        for start in range(keep, length, block):
            rows = np.concatenate([mine, np.arange(start, min(start + block, length))])
            mine = rows[np.argsort(-score(keys[head, rows]), kind="stable")[:keep]]
        kept.append(np.sort(mine))
    return np.array(kept)


@pytest.mark.parametrize("scorer, formula", [("knorm", numpy_knorm), ("keydiff", numpy_keydiff)])
@pytest.mark.parametrize("length", [100, 700, 1030])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_block_keeps_what_the_numpy_formula_keeps(scorer, formula, length, ratio) -> None:
    prefill = rows_prefill(length, seed=1)
    part = REGISTRY[f"block({scorer})"].compress(prefill, ratio)
    keep = n_kept(length, ratio)
    assert part.kept.shape == (2, keep) and part.saved == pytest.approx(1 - keep / length)
    np.testing.assert_array_equal(part.kept.numpy(), numpy_block(prefill.key.numpy(), ratio, formula))


def test_keydiff_block_by_block_differs_from_keydiff_at_once() -> None:
    prefill = rows_prefill(1030, seed=1)  # the anchor of each step is the mean of what it sees: not the context's
    block, once = REGISTRY["block(keydiff)"].compress(prefill, 0.75), REGISTRY["keydiff"].compress(prefill, 0.75)
    assert not torch.equal(block.kept, once.kept)


@pytest.mark.parametrize("scorer", ROWSCORERS)
def test_one_step_over_the_whole_context_is_the_scorer_alone(scorer) -> None:
    prefill, _ = make_prefill(length=300)
    for ratio in (0.25, 0.4):  # n_kept + 128 ≥ 300: one step (at 0.58, 126 + 128 < 300: two)
        part, alone = REGISTRY[f"block({scorer})"].compress(prefill, ratio), REGISTRY[scorer].compress(prefill, ratio)
        assert torch.equal(part.kept, alone.kept)


def test_the_survivors_come_first_in_the_order_topk_left_them() -> None:
    """A scorer preferring the last rows it is handed: topk returns the survivors last-first, so the next step hands
    them reversed and keeps the earliest of them (kept in position order instead, it would keep the latest)."""
    later = type("Later", (ScorerPress,), {"name": "later", "score": lambda self, prefill, ratio: torch.arange(
        prefill.length, dtype=torch.float64).expand(prefill.kv_heads, -1)})()
    prefill, _ = make_prefill(length=40)
    kept = block_keep(REGISTRY["block"].bind(later), prefill, 0.5, block=10)  # keeps 20: rows 0…29, then 30…39
    assert kept[0].tolist() == [*range(10, 20), *range(30, 40)] and (kept[0] == kept[1]).all()


@pytest.mark.parametrize("block", [16, 128, 300])
def test_block_size_is_a_setting(block) -> None:
    """BlockPress(block_size=…): block configured with another block size keeps the numpy formula's survivors."""
    from spectra.kv.presses.fields import configured

    prefill = rows_prefill(700, seed=2)
    press = configured(REGISTRY["block(keydiff)"], block_size=block)
    np.testing.assert_array_equal(press.compress(prefill, 0.5).kept.numpy(),
                                  numpy_block(prefill.key.numpy(), 0.5, numpy_keydiff, block))
    assert REGISTRY["block(keydiff)"].block_size == 128
