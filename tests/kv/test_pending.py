"""The order in which the cells of several examples are compressed and the groups `--decode-memory` cuts them
into, against the arithmetic written out here."""

from __future__ import annotations

from spectra.kv import batching
from spectra.kv.pending import Groups, Waiting, order, room


def test_one_example_goes_by_ratio_the_full_cache_first() -> None:
    """On one example the order is the ratio's, ties by cell, as the probe always decoded (so --batch-size 1 groups
    exactly as before)."""
    ratios = [0.0, 0.5, 0.25, 0.5, 0.25]
    assert order([100], ratios) == [(0, 0), (0, 2), (0, 4), (0, 1), (0, 3)]


def test_several_examples_go_widest_first() -> None:
    """Examples of 100 and 40 tokens at ratios 0, 0.5 and 0.75: widths 100, 40 | 50, 20 | 25, 10 — widest first, so
    the 40-token example's full cache sits between the other's halves and quarters."""
    got = order([100, 40], [0.0, 0.5, 0.75])
    assert got == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (1, 2)]
    assert order([100, 40], [0.0, 0.5, 0.75], [5, 5]) == got


def test_examples_answering_in_fewer_tokens_go_first() -> None:
    """A passkey example (10 new tokens) before a niah one (128), whatever their widths: the niah rows that run to
    128 tokens share their groups with one another, not with rows that stop at 10."""
    got = order([100, 40, 60], [0.0, 0.5], [128, 10, 10])
    assert got == [(2, 0), (1, 0), (2, 1), (1, 1), (0, 0), (0, 1)]


def test_a_group_is_cut_where_the_next_cell_would_pass_the_budget() -> None:
    row = batching.batch_row_bytes(2, 8, 8, 4)

    def waiting(owner, rows, held=0, copies=1, longest=3, new=5):
        return Waiting(owner, 0, rows, held, copies, longest, new)

    first, second = waiting(0, [10, 12]), waiting(1, [6, 4], held=50, copies=2, longest=6, new=2)
    assert room([first, second]) == 6 + 5  # the longest question, the most new tokens
    # three rows (the second cell answers two questions), each as wide as the widest cell plus the room, per layer
    both = 3 * ((10 + 11) + (12 + 11)) * row + 50
    assert Groups(10**9, row).bytes([first, second]) == both
    groups = Groups(both, row)
    assert groups.add(first) == [] and groups.add(second) == []
    third = waiting(0, [1, 1])
    assert groups.add(third) == [first, second]  # a fourth row would pass the budget: the two decode first
    assert groups.rest() == [third] and groups.rest() == []
    alone = Groups(1, row)  # a cell alone beyond the budget still decodes, in a group of its own
    assert alone.add(first) == [] and alone.add(third) == [first] and alone.rest() == [third]
