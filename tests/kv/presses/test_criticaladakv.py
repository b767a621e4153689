"""CriticalAdaKV against a numpy formula written here from kvpress 0.5.5's CriticalAdaKVPress: AdaKV's per-head
budgets (each head's best max(1, int(0.2·n_kept)) secured, then the layer's H_kv·n_kept best), each head's
int(b_h·0.5) best raised, then its b_h best by (s + 1e-4)·n kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.criticaladakv import critical_adaptive_keep

from .conftest import KV_HEADS, make_prefill
from .test_criticalkv import numpy_norms, with_w_o


def numpy_critical_adakv(scores: np.ndarray, norms: np.ndarray, keep: int) -> np.ndarray:
    """(H_kv, L) bool kept, from distinct float scores; secured and staged tokens ranked first as +inf."""
    heads, length = scores.shape
    order = np.argsort(-scores, axis=-1, kind="stable")
    secured = np.zeros(scores.shape, dtype=bool)
    for head in range(heads):
        secured[head, order[head, :max(1, int(keep * 0.2))]] = True
    ranked = np.where(secured, np.inf, scores).ravel()
    in_budget = np.zeros(ranked.size, dtype=bool)
    in_budget[np.argsort(-ranked, kind="stable")[:heads * keep]] = True
    budgets = in_budget.reshape(heads, length).sum(-1)
    kept = np.zeros(scores.shape, dtype=bool)
    for head in range(heads):
        staged = secured[head].copy()
        staged[order[head, :budgets[head] // 2]] = True
        weighed = np.where(staged, np.inf, (scores[head] + 1e-4) * norms[head])
        kept[head, np.argsort(-weighed, kind="stable")[:budgets[head]]] = True
    return kept


@pytest.mark.parametrize("scorer", ["knorm", "keydiff", "random", "observed"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.8, 0.95])
def test_criticaladakv_keeps_what_the_numpy_formula_keeps(scorer, ratio) -> None:
    prefill, arrays = with_w_o()
    part = REGISTRY[f"criticaladakv({scorer})"].compress(prefill, ratio)
    keep = n_kept(100, ratio)
    scores = REGISTRY[scorer].score(prefill, ratio).numpy()
    expected = numpy_critical_adakv(scores, numpy_norms(arrays["v"], arrays["w_o"]), keep)
    np.testing.assert_array_equal(part.kept_mask(100).numpy(), expected)
    counts = part.counts()
    assert int(counts.sum()) == KV_HEADS * keep and int(counts.min()) >= max(1, int(keep * 0.2))
    assert part.saved == pytest.approx(1 - keep / 100)


def test_the_heads_share_adakv_budgets_and_fill_them_by_the_weighed_scores() -> None:
    scores = torch.tensor([[9.0, 8.0, 7.0, 6.0, 0.1, 0.2], [0.5, 0.6, 0.7, 0.3, 0.4, 5.0]])
    norms = torch.tensor([[1.0, 1.0, 1.0, 1.0, 100.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    kept = critical_adaptive_keep(scores, norms, 3)  # AdaKV's budgets: 4 and 2 (adakv's own test)
    assert kept.sum(-1).tolist() == [4, 2]
    # head 0: its 2 best stay (stage 1), then 0.1 · 100 outweighs 7 and 6 and joins 7 (the next by (s + ε)·n)
    assert kept[0].tolist() == [True, True, True, False, True, False]
    assert kept[1].tolist() == [False, False, True, False, False, True]


def test_it_differs_from_adakv_and_is_refused_without_w_o() -> None:
    prefill, _ = with_w_o()
    assert not torch.equal(REGISTRY["adakv(knorm)"].compress(prefill, 0.5).kept_mask(100),
                           REGISTRY["criticaladakv(knorm)"].compress(prefill, 0.5).kept_mask(100))
    with pytest.raises(SpectraError, match=r"^criticaladakv\(knorm\) weighs each token by .* W\^O"):
        REGISTRY["criticaladakv(knorm)"].compress(make_prefill()[0], 0.5)
    with pytest.raises(ValueError, match="needs a scorer"):
        REGISTRY["criticaladakv"].compress(prefill, 0.5)
