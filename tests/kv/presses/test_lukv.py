"""`lukv(FILE)` against numpy written here from kvpress 0.5.5's LUKVPress: per key/value head the count a budget curve
allots (the layer's total rounded, the remainder to the largest fractions), Expected Attention's scores with epsilon
2e-2 (the numpy formula of test_expected plus 0.02 · ‖v‖), the first 4 and the last token protected; bad curves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY
from spectra.kv.presses.lukv import head_counts
from spectra.registry import PRESSES

from .test_expected import numpy_expected, with_queries


def numpy_counts(prune: np.ndarray, length: int) -> np.ndarray:
    """Each head's kept count: ideal c = clip(1 − p, 0, 1) · L, total round(Σc) within [H, H·L], ⌊c⌋ plus one for
    the heads with the largest fractions while the total is not reached, at least 1 (float32 as kvpress)."""
    ideal = np.clip(1 - prune.astype(np.float32), 0, 1).astype(np.float32) * np.float32(length)
    heads = len(prune)
    total = min(heads * length, max(heads, int(np.round(ideal.sum(dtype=np.float32)))))
    counts = np.floor(ideal).astype(int)
    extra = total - counts.sum()
    if extra > 0:
        counts[np.argsort(-(ideal - counts), kind="stable")[:extra]] += 1
    return np.clip(counts, 1, length)


def numpy_lukv(arrays: dict, counts: np.ndarray) -> np.ndarray:
    """(H_kv, L) bool: each head's counts[h] best tokens by Expected Attention's score (attention + 0.02) · ‖v‖, the
    first 4 and the last one above all."""
    scores = numpy_expected(arrays["q_pre"], arrays["k"], arrays["v"])
    scores[:, 4:] += 0.02 * np.linalg.norm(arrays["v"][:, 4:], axis=-1)
    scores[:, :4] = scores[:, -1:] = np.inf
    keep = np.zeros(scores.shape, dtype=bool)
    for head, count in enumerate(counts):
        keep[head, np.argsort(-scores[head], kind="stable")[:count]] = True
    return keep


def curve(layers: int, kv_heads: int, seed: int = 0) -> np.ndarray:
    """A budget curve (99, layers, H_kv) whose prune ratios grow with the target and differ by head."""
    rng = np.random.default_rng(seed)
    targets = np.arange(1, 100)[:, None, None] / 100
    return np.clip(targets + rng.uniform(-0.3, 0.3, (1, layers, kv_heads)), -0.1, 1.05).astype(np.float32)


@pytest.fixture
def curve_file(tmp_path):
    path = tmp_path / "curve.npy"
    np.save(path, curve(3, 2))
    return path


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.875])
@pytest.mark.parametrize("layer", [0, 2])
def test_each_head_keeps_what_the_curve_allots_by_expected_attention(curve_file, ratio, layer) -> None:
    prefill, arrays = with_queries(length=100, seed=layer)
    prefill = type(prefill)(**{**prefill.__dict__, "layer": layer})
    part = REGISTRY[f"lukv({curve_file})"].compress(prefill, ratio)
    prune = curve(3, 2)[round(ratio * 100) - 1, layer]
    counts = numpy_counts(prune, 100)
    np.testing.assert_array_equal(part.counts().numpy(), counts)
    np.testing.assert_array_equal(part.kept_mask(100).numpy(), numpy_lukv(arrays, counts))
    assert part.saved == pytest.approx(1 - counts.sum() / 200)
    roomy = torch.from_numpy(counts >= 5)  # a head keeping fewer keeps the first protected ones (a stable sort)
    assert part.kept_mask(100)[roomy][:, [0, 1, 2, 3, 99]].all(), "sinks and the last token"


def test_the_counts_round_the_total_and_hand_the_remainder_to_the_largest_fractions() -> None:
    prune = torch.tensor([0.504, 0.303, 0.9, -0.2, 1.5])  # ideal 4.96, 6.97, 1.0, 10, 0 of 10 → total 23
    assert head_counts(prune, 10).tolist() == [5, 7, 1, 10, 1]  # floors 4, 6, 1, 10, 0: +1 to the two largest; ≥ 1
    for seed in range(20):
        rng = np.random.default_rng(seed)
        prune = rng.uniform(-0.2, 1.2, 7).astype(np.float32)
        np.testing.assert_array_equal(head_counts(torch.from_numpy(prune), 37).numpy(), numpy_counts(prune, 37))


def test_a_curve_pruning_nothing_keeps_the_whole_cache(tmp_path) -> None:
    path = tmp_path / "none.npy"
    np.save(path, np.zeros((99, 1, 2)))
    prefill, _ = with_queries(length=50)
    part = REGISTRY[f"lukv({path})"].compress(prefill, 0.5)
    assert part.saved == 0 and part.counts().tolist() == [50, 50]


def test_the_unbound_press_and_the_facts(curve_file) -> None:
    with pytest.raises(ValueError, match="needs a budget curve"):
        REGISTRY["lukv"].compress(with_queries()[0], 0.5)
    facts = PRESSES.resolve(f"lukv({curve_file})").facts
    assert facts["reads"] == ("query_pre",) and facts["needs_rope"] and REGISTRY["lukv"].peer == "LUKVPress"
    with pytest.raises(SpectraError, match=r"^LU-KV budget curve nosuch.npy: no such file"):
        PRESSES.resolve("lukv(nosuch.npy)")
