"""`finch` against numpy: FINCH's scores (kvpress 0.5.5's FinchPress at its defaults) — the question's rows of the
causal softmax over every key, row i times L − w + i, averaged over rows and groups, the window kept — with the
window the question's tokens or, without one, the last 64; the kept rows, chunk by chunk too; the kept keys turned
by RoPE (built here from 2 × 2 blocks) to positions 0 … m − 1 and the continuation from m; bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.finch import Finch, finch_scores
from spectra.registry import PRESSES, press_names

from .conftest import DIM, KV_HEADS, make_prefill
from .test_expected import rope, rotation


def numpy_finch(p: np.ndarray, window: int, groups: int = 3) -> np.ndarray:
    """(H_kv, L): mean over the last `window` rows i of P (H, L, L) of P[i, j]·(L − window + i) for j < L − window,
    mean over each group of query heads; the window scored the maximum + 1."""
    length = p.shape[-1]
    rows = p[:, length - window:, : length - window] * np.arange(length - window, length)[None, :, None]
    scores = rows.mean(axis=1).reshape(KV_HEADS, groups, -1).mean(axis=1)
    return np.concatenate([scores, np.full((KV_HEADS, window), scores.max() + 1)], axis=1)


def with_rope(length: int = 100, seed: int = 0, question: int = 0) -> tuple:
    prefill, arrays = make_prefill(length=length, seed=seed)
    key_pre = np.random.default_rng(seed + 9).standard_normal((KV_HEADS, length, DIM))
    arrays["key_pre"] = key_pre
    return dataclasses.replace(prefill, key_pre=torch.from_numpy(key_pre), rope=rope,
                               question_tokens=question), arrays


@pytest.mark.parametrize("question", [0, 7, 18])
def test_scores_equal_the_normalized_window_attention(question) -> None:
    prefill, arrays = with_rope(question=question)
    window = question or 64
    np.testing.assert_allclose(finch_scores(prefill, window).numpy(), numpy_finch(arrays["p"], window), rtol=1e-12)
    plain = finch_scores(prefill, window, normalize=False).numpy()
    assert not np.allclose(plain, numpy_finch(arrays["p"], window))


@pytest.mark.parametrize("ratio, question", [(0.25, 7), (0.5, 18), (0.4, 0), (0.9, 3)])  # no tied window dropped
def test_it_keeps_the_top_scores_and_turns_their_keys_to_0_to_m(ratio, question) -> None:
    prefill, arrays = with_rope(120, 2, question)
    compressed = REGISTRY["finch"].compress(prefill, ratio)
    keep = n_kept(120, ratio)
    scores = numpy_finch(arrays["p"], question or 64)
    expected = np.sort(np.argsort(-scores, axis=-1, kind="stable")[:, :keep], axis=-1)
    np.testing.assert_array_equal(compressed.kept.numpy(), expected)
    assert compressed.start == keep and compressed.saved == pytest.approx(1 - keep / 120)
    turned = np.stack([[rotation(j) @ arrays["key_pre"][h, expected[h, j]] for j in range(keep)]
                       for h in range(KV_HEADS)])
    np.testing.assert_allclose(compressed.key.numpy(), turned, rtol=1e-10, atol=1e-12)
    assert compressed.value is None, "the values are the kept rows' own"
    if question:  # the question's tokens are always kept
        assert set(range(120 - question, 120)) <= set(compressed.kept[0].tolist())


def test_chunks_keep_n_kept_of_each() -> None:
    prefill, arrays = with_rope(150, 4, 10)
    compressed = Finch(chunk=40).compress(prefill, 0.5)
    scores = numpy_finch(arrays["p"], 10)
    expected = np.sort(np.concatenate([start + np.argsort(-scores[:, start:start + 40], axis=-1, kind="stable")[
        :, :n_kept(len(range(start, min(start + 40, 150))), 0.5)] for start in range(0, 150, 40)], axis=1), axis=1)
    np.testing.assert_array_equal(compressed.kept.numpy(), expected)
    assert compressed.kept.shape[-1] == 20 + 20 + 20 + 15
    with pytest.raises(ValueError, match="must exceed its window over the kept share"):
        Finch(chunk=20).compress(prefill, 0.5)


def test_its_declaration_and_bad_input() -> None:
    facts = dict(PRESSES.facts("finch"))
    assert facts["windowed"] and facts["needs_rope"] and facts["window"] == 64 and facts["peer"] == "FinchPress"
    assert "scorer" not in facts, "kvpress's FinchPress is no ScorerPress: no wrapper takes it"
    long, _ = with_rope(100, 1, 65)
    with pytest.raises(ValueError, match="finch reads the question's 65 tokens as its window, but the prefill kept "
                                         "the last 64 queries"):
        REGISTRY["finch"].compress(long, 0.5)
    plain, _ = make_prefill()
    with pytest.raises(ValueError, match="reads the keys before RoPE and the model's RoPE"):
        REGISTRY["finch"].compress(plain, 0.5)
    with pytest.raises(SpectraError, match="adakv wraps a scorer press, and 'finch' is not one"):
        press_names(["adakv(finch)"])
