"""AdaKV against a numpy formula written here from kvpress 0.5.5's AdaKVPress: each head secures its best
max(1, int(0.2 · n_kept)) tokens, then the H_kv · (L − n_kept) lowest scores of the layer are evicted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.adakv import adaptive_keep

from .conftest import make_prefill


def numpy_adakv(scores: np.ndarray, keep: int, safeguard: float = 0.2) -> np.ndarray:
    """(H_kv, L) bool kept, from distinct float scores (no ties but the secured ones)."""
    heads, length = scores.shape
    safe = max(1, int(keep * safeguard))
    secured = np.zeros_like(scores, dtype=bool)
    for head in range(heads):
        secured[head, np.argsort(-scores[head])[:safe]] = True
    flat = np.where(secured, np.inf, scores).ravel()
    kept = np.ones(flat.size, dtype=bool)
    kept[np.argsort(flat)[:heads * (length - keep)]] = False
    return kept.reshape(heads, length)


@pytest.mark.parametrize("scorer", ["knorm", "snapkv", "tova", "random", "observed"])
@pytest.mark.parametrize("ratio", [0.3, 0.75, 0.95])
def test_adakv_keeps_what_the_numpy_formula_keeps(scorer, ratio) -> None:
    prefill, _ = make_prefill(length=100)
    press = REGISTRY[f"adakv({scorer})"]
    part = press.compress(prefill, ratio)
    keep = n_kept(100, ratio)
    scores = REGISTRY[scorer].score(prefill, ratio).numpy()
    if scorer in ("snapkv", "tova"):  # their protected window ties at max + 1 (topk's tie-break, as in kvpress)
        window = 64 if scorer == "snapkv" else 1
        if 2 * (100 - keep) <= 2 * (100 - window):  # fewer evicted than unprotected tokens: the window stays
            assert part.kept_mask(100)[:, -window:].all()
    else:
        np.testing.assert_array_equal(part.kept_mask(100).numpy(), numpy_adakv(scores, keep))
    counts = part.counts()
    assert int(counts.sum()) == 2 * keep and part.saved == pytest.approx(1 - keep / 100)
    assert int(counts.min()) >= max(1, int(keep * 0.2))


def test_the_heads_keep_different_counts_and_compete_on_scores() -> None:
    scores = torch.tensor([[9.0, 8.0, 7.0, 6.0, 0.1, 0.2], [0.5, 0.6, 0.7, 0.3, 0.4, 5.0]])
    kept = adaptive_keep(scores, 3, 0.2)  # secures one per head, then evicts the 6 lowest of the rest
    assert kept.tolist() == [[True, True, True, True, False, False], [False, False, True, False, False, True]]
    assert adaptive_keep(scores, 3, 0.0).sum(dim=-1).tolist() == [4, 2], "without safeguard: score alone"


def test_a_wrapped_scorer_takes_its_facts_and_calibration() -> None:
    assert REGISTRY["adakv(snapkv)"].windowed and REGISTRY["adakv(snapkv)"].name == "adakv(snapkv)"
    loki = REGISTRY["adakv(loki)"]
    assert loki.calibrates and loki.fresh().inner is not REGISTRY["loki"]
    with pytest.raises(ValueError, match="needs a scorer"):
        REGISTRY["adakv"].compress(make_prefill()[0], 0.5)
