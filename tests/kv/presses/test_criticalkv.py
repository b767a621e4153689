"""CriticalKV against numpy formulas written here from kvpress 0.5.5's CriticalKVPress: the value norms
‖v W_O,hᵀ‖₁ averaged over each key/value group, the first stage's int((1 − r)·L·0.5) best scores, the rest of n_kept
by (s + 1e-4)·n."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.criticalkv import NORMS, first_stage, value_norms

from .conftest import DIM, HEADS, KV_HEADS, make_prefill

WIDTH = 12  # the model width D of the random output projection


def with_w_o(length: int = 100, seed: int = 0):
    """A random prefill with a random W^O (D, H·d) whose head blocks differ in scale, and its numpy arrays."""
    prefill, arrays = make_prefill(length=length, seed=seed)
    rng = np.random.default_rng(seed + 100)
    w_o = rng.standard_normal((WIDTH, HEADS * DIM)) * np.repeat(rng.uniform(0.2, 3.0, HEADS), DIM)
    return dataclasses.replace(prefill, w_o=torch.from_numpy(w_o)), {**arrays, "w_o": w_o}


def numpy_norms(v: np.ndarray, w_o: np.ndarray) -> np.ndarray:
    """(H_kv, L): for each key/value head g, the mean over its query heads h of Σ_D |v_g W_O[:, h·d:(h+1)·d]ᵀ|."""
    groups = HEADS // KV_HEADS
    per_head = np.stack([np.abs(v[h // groups] @ w_o[:, h * DIM:(h + 1) * DIM].T).sum(-1) for h in range(HEADS)])
    return per_head.reshape(KV_HEADS, groups, -1).mean(1)


def numpy_critical(scores: np.ndarray, norms: np.ndarray, ratio: float) -> np.ndarray:
    """(H_kv, L) bool kept: per head the stage-1 best by score, then the best of the others by (s + ε)·n."""
    length = scores.shape[-1]
    keep = max(1, int(length * (1 - ratio)))
    first = max(1, int((1 - ratio) * length * 0.5))
    kept = np.zeros(scores.shape, dtype=bool)
    for head in range(scores.shape[0]):
        stage = np.argsort(-scores[head], kind="stable")[:first]
        kept[head, stage] = True
        weighed = np.where(kept[head], -np.inf, (scores[head] + 1e-4) * norms[head])
        kept[head, np.argsort(-weighed, kind="stable")[:keep - first]] = True
    return kept


def test_the_value_norms_are_the_l1_norms_through_each_heads_output_columns() -> None:
    prefill, arrays = with_w_o()
    np.testing.assert_allclose(value_norms(prefill, "criticalkv(knorm)").numpy(),
                               numpy_norms(arrays["v"], arrays["w_o"]), rtol=1e-12)


def test_the_value_norms_are_computed_once_per_prefill_and_freed_with_it() -> None:
    """A sweep asks for a layer's norms at every ratio of both critical presses: one computation serves them all, and
    the entry goes when the prefill does (no example's norms outlive it)."""
    gc.collect()
    before = len(NORMS)  # other tests' prefills still alive
    prefill, _ = with_w_o()
    first = value_norms(prefill, "criticalkv(knorm)")
    assert value_norms(prefill, "criticaladakv(snapkv)") is first and len(NORMS) == before + 1
    other, _ = with_w_o(seed=3)
    assert not torch.equal(value_norms(other, "criticalkv(knorm)"), first) and len(NORMS) == before + 2
    del prefill, other, first
    gc.collect()
    assert len(NORMS) == before


@pytest.mark.parametrize("scorer", ["knorm", "keydiff", "random", "observed", "leverage"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.8, 0.95])
def test_criticalkv_keeps_what_the_numpy_formula_keeps(scorer, ratio) -> None:
    prefill, arrays = with_w_o()
    part = REGISTRY[f"criticalkv({scorer})"].compress(prefill, ratio)
    scores = REGISTRY[scorer].score(prefill, ratio).numpy()
    expected = numpy_critical(scores, numpy_norms(arrays["v"], arrays["w_o"]), ratio)
    np.testing.assert_array_equal(part.kept_mask(100).numpy(), expected)
    assert part.valid is None and part.kept.shape == (KV_HEADS, n_kept(100, ratio))
    assert part.saved == pytest.approx(1 - n_kept(100, ratio) / 100)


def test_the_value_norms_change_the_choice_and_the_first_stage_stays() -> None:
    prefill, _ = with_w_o()
    scorer, critical = REGISTRY["knorm"].compress(prefill, 0.5), REGISTRY["criticalkv(knorm)"].compress(prefill, 0.5)
    assert not torch.equal(scorer.kept, critical.kept), "the weighed half chose the same tokens as the scorer"
    best = np.argsort(-REGISTRY["knorm"].score(prefill, 0.5).numpy(), axis=-1)[:, :first_stage(100, 0.5)]
    assert all(critical.kept_mask(100)[head, best[head]].all() for head in range(KV_HEADS))


def test_the_first_stage_is_kvpress_selection_budget() -> None:
    assert [first_stage(100, r) for r in (0.25, 0.5, 0.9, 0.999)] == [37, 25, 4, 1]
    assert first_stage(256, 0.5) == 64 and first_stage(10, 1.0) == 0


def test_a_prefill_without_an_output_projection_is_refused_in_one_line() -> None:
    prefill, _ = make_prefill()
    with pytest.raises(SpectraError, match=r"^criticalkv\(knorm\) weighs each token by .* W\^O, .*choose another"):
        REGISTRY["criticalkv(knorm)"].compress(prefill, 0.5)
    with pytest.raises(ValueError, match="needs a scorer"):
        REGISTRY["criticalkv"].compress(with_w_o()[0], 0.5)
    facts = REGISTRY.facts("criticalkv(snapkv)")
    assert facts["windowed"] and not facts.get("scorer") and REGISTRY["criticalkv(loki)"].calibrates
