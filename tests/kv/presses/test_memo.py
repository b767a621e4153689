"""`memo.remembered`: a layer's ratio-free scores computed once per prefill and press settings, handed out as copies
bitwise equal to a fresh computation, recomputed for other settings, and gone with the prefill; and the presses that
use it (compactor, cap, expected_attention) scoring every ratio as their own functions do without it."""

from __future__ import annotations

import gc

import torch

from spectra.kv.presses import REGISTRY
from spectra.kv.presses.cap import cap_scores
from spectra.kv.presses.compactor import compactor_scores
from spectra.kv.presses.expected import expected_scores
from spectra.kv.presses.fields import configured
from spectra.kv.presses.leverage import layer_sketch
from spectra.kv.presses.memo import _KEPT, remembered

from .test_compactor import with_keys_before_rope


def test_a_part_is_computed_once_per_prefill_and_each_caller_gets_its_own_copy() -> None:
    prefill, _ = with_keys_before_rope(40)
    press, calls = REGISTRY["cap"], []

    def compute() -> torch.Tensor:
        calls.append(1)
        return torch.arange(6.0)

    first = remembered(prefill, press, compute)
    first[0] = 99.0  # a caller writing into its scores does not reach the next one
    second = remembered(prefill, press, compute)
    assert len(calls) == 1 and torch.equal(second, torch.arange(6.0))
    other, _ = with_keys_before_rope(40)  # another prefill (an equal one) is computed anew
    remembered(other, press, compute)
    assert len(calls) == 2


def test_other_settings_or_another_part_are_computed_anew() -> None:
    prefill, _ = with_keys_before_rope(40)
    press = REGISTRY["expected_attention"]
    tighter = configured(press, epsilon=0.01)
    calls = []
    for asked in (press, tighter, press, tighter):
        remembered(prefill, asked, lambda: calls.append(1) or torch.zeros(1))
    remembered(prefill, press, lambda: calls.append(1) or torch.zeros(1), part="other")
    assert len(calls) == 3


def test_what_is_kept_goes_with_its_prefill() -> None:
    prefill, _ = with_keys_before_rope(40)
    remembered(prefill, REGISTRY["cap"], lambda: torch.zeros(1))
    before = len(_KEPT)
    del prefill
    gc.collect()
    assert len(_KEPT) == before - 1


def test_the_presses_score_every_ratio_as_their_functions_do_without_the_memo() -> None:
    prefill, _ = with_keys_before_rope(300, seed=4)
    tighter = configured(REGISTRY["expected_attention"], epsilon=0.01, use_vnorm=False)
    for ratio in (0.25, 0.5, 0.875, 0.25):
        assert torch.equal(REGISTRY["compactor"].score(prefill, ratio),
                           compactor_scores(prefill, ratio, layer_sketch(prefill)))
        assert torch.equal(REGISTRY["cap"].score(prefill, ratio), cap_scores(prefill))
        assert torch.equal(REGISTRY["expected_attention"].score(prefill, ratio), expected_scores(prefill))
        assert torch.equal(tighter.score(prefill, ratio), expected_scores(prefill, epsilon=0.01, use_vnorm=False))
    assert not torch.equal(REGISTRY["compactor"].score(prefill, 0.25), REGISTRY["compactor"].score(prefill, 0.875))
