"""`chunkkv(<scorer>)` and `entropy_gated_chunkkv(<scorer>)` against numpy formulas written here from kvpress 0.5.5's
ChunkKVPress (chunks of 20 by mean head-summed score, kept whole) and EntropyGatedChunkKVPress (chunks of 10, a spiky
important chunk cut to its 4 best, exactly n_kept tokens)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.chunkkv import gated_keep
from spectra.registry import PRESSES

from .conftest import make_prefill


def numpy_chunkkv(scores: np.ndarray, ratio: float, chunk: int = 20) -> np.ndarray:
    """Ascending positions kept: the int(C · (1 − r)) chunks (at least one) with the best mean head-summed score."""
    summed = scores.sum(axis=0)
    starts = list(range(0, summed.size, chunk))
    means = np.array([summed[start:start + chunk].mean() for start in starts])
    chosen = np.argsort(-means, kind="stable")[:max(1, int(len(starts) * (1 - ratio)))]
    return np.sort(np.concatenate([np.arange(starts[c], min(starts[c] + chunk, summed.size)) for c in chosen]))


def numpy_entropy(row: np.ndarray) -> float:
    """Normalized entropy of one chunk's scores as kvpress gates it: shifted if negative, ε 1e-8, over log c."""
    if row.size == 1:
        return 0.0
    shifted = row - min(row.min(), 0.0)
    p = shifted / (shifted.sum() + 1e-8)
    return float(np.clip(-(p * np.log(p + 1e-8)).sum() / math.log(row.size), 0.0, 1.0))


def numpy_gated(scores: np.ndarray, keep: int, chunk: int = 10, spiky: int = 4) -> np.ndarray:
    """Ascending positions EntropyGatedChunkKVPress keeps (scores with distinct values, so no ties)."""
    summed = scores.sum(axis=0)
    bounds = [(start, min(start + chunk, summed.size)) for start in range(0, summed.size, chunk)]
    means = np.array([summed[a:b].mean() for a, b in bounds])
    entropy = np.array([numpy_entropy(summed[a:b]) for a, b in bounds])
    lower_median = lambda x: np.sort(x)[(x.size - 1) // 2]  # noqa: E731  (torch.median's)
    important, spiked = means >= lower_median(means), entropy < lower_median(entropy)
    kept = np.zeros(summed.size, dtype=bool)
    budget = keep
    for index in np.argsort(-means, kind="stable"):
        if budget <= 0:
            break
        a, b = bounds[index]
        taken = min(b - a, budget, spiky if important[index] and spiked[index] else b - a)
        kept[a + np.argsort(-summed[a:b], kind="stable")[:taken]] = True
        budget -= taken
    left = np.flatnonzero(~kept)
    kept[left[np.argsort(-summed[left], kind="stable")[:budget]]] = True
    return np.flatnonzero(kept)


@pytest.mark.parametrize("scorer", ["knorm", "snapkv", "keydiff", "random", "observed"])
@pytest.mark.parametrize("length", [100, 107, 143])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_chunkkv_keeps_the_numpy_formulas_whole_chunks(scorer, length, ratio) -> None:
    prefill, _ = make_prefill(length=length)
    part = REGISTRY[f"chunkkv({scorer})"].compress(prefill, ratio)
    scores = REGISTRY[scorer].score(prefill, ratio).numpy()
    if scorer == "snapkv":  # its protected window's chunks tie (max + 1 everywhere): topk's tie-break; whole chunks
        starts = sorted({int(position) // 20 * 20 for position in part.kept[0]})
        whole = [position for start in starts for position in range(start, min(start + 20, length))]
        assert part.kept[0].tolist() == whole and len(starts) == max(1, int(-(-length // 20) * (1 - ratio)))
        return
    expected = numpy_chunkkv(scores, ratio)
    np.testing.assert_array_equal(part.kept.numpy(), np.broadcast_to(expected, (2, expected.size)))
    assert part.saved == pytest.approx(1 - expected.size / length)


def test_chunkkv_keeps_whole_chunks_where_the_summed_scores_are_highest() -> None:
    prefill, _ = make_prefill(length=70)  # chunks [0, 20), [20, 40), [40, 60), [60, 70)
    scores = torch.zeros(2, 70, dtype=torch.float64)
    scores[0, 45] = 100.0  # one key/value head's single token makes its chunk the best
    scores[1, 60:70] = 3.0  # the other head's tail chunk second (mean 3 of 10 tokens)
    scores[1, 0:20] = 1.0
    fixed = type("Fixed", (type(REGISTRY["knorm"]),), {"score": lambda self, p, r: scores})()
    part = REGISTRY["chunkkv"].bind(fixed).compress(prefill, 0.5)  # int(4 · 0.5) = 2 chunks
    assert part.kept[0].tolist() == [*range(40, 60), *range(60, 70)] and (part.kept[0] == part.kept[1]).all()
    assert part.saved == pytest.approx(1 - 30 / 70)


def test_a_context_shorter_than_a_chunk_is_the_scorers_own() -> None:
    prefill, _ = make_prefill(length=19)
    for ratio in (0.3, 0.6):
        part, alone = REGISTRY["chunkkv(knorm)"].compress(prefill, ratio), REGISTRY["knorm"].compress(prefill, ratio)
        assert torch.equal(part.kept, alone.kept) and part.kept.shape[-1] == n_kept(19, ratio)


@pytest.mark.parametrize("scorer", ["knorm", "snapkv", "keydiff", "random", "observed"])
@pytest.mark.parametrize("length", [100, 107, 121, 131])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_entropy_gated_keeps_what_the_numpy_formula_keeps(scorer, length, ratio) -> None:
    prefill, _ = make_prefill(length=length)
    part = REGISTRY[f"entropy_gated_chunkkv({scorer})"].compress(prefill, ratio)
    keep = n_kept(length, ratio)
    assert part.kept.shape == (2, keep) and (part.kept[0] == part.kept[1]).all()
    assert part.saved == pytest.approx(1 - keep / length)
    scores = REGISTRY[scorer].score(prefill, ratio).float().numpy().astype(np.float64)
    if scorer != "snapkv":  # snapkv's protected window ties (max + 1 everywhere): topk's tie-break
        np.testing.assert_array_equal(part.kept[0].numpy(), numpy_gated(scores, keep))


def test_a_spiky_important_chunk_keeps_only_its_four_best() -> None:
    summed = torch.ones(40, dtype=torch.float64)
    summed[:10] += 0.01 * torch.arange(10)
    summed[5] = 50.0  # chunk 0: mean 5.9, one token carries it (the lowest entropy, below the median)
    summed[10:20] = 4.0  # chunk 1: mean 4, flat (entropy 1)
    summed[20:30] = torch.linspace(0.5, 0.6, 10)  # chunk 2: mean 0.55, nearly flat; chunk 3: mean 1, flat
    kept = gated_keep(torch.stack([summed / 2, summed / 2]), 14)
    assert kept.tolist() == [5, 7, 8, 9, *range(10, 20)], "the spiky chunk's 4 best, then chunk 1 whole"
    assert gated_keep(torch.stack([summed / 2, summed / 2]), 3).tolist() == [5, 8, 9], "a budget below 4"
    flat = summed.clone()
    flat[:10] = 5.9 + 0.01 * torch.arange(10)  # chunk 0 coherent now: kept whole, then 4 of chunk 1
    assert gated_keep(torch.stack([flat, flat]), 14).tolist()[:10] == list(range(10))


@pytest.mark.parametrize("name", ["chunkkv", "entropy_gated_chunkkv"])
def test_bad_input_and_facts(name) -> None:
    with pytest.raises(SpectraError, match=f"{name} wraps a scorer press, and 'think' is not one"):
        PRESSES.resolve(f"{name}(think)")
    with pytest.raises(ValueError, match="needs a scorer press"):
        REGISTRY[name].compress(make_prefill()[0], 0.5)
    assert REGISTRY[f"{name}(snapkv)"].windowed and PRESSES.resolve(f"{name}(snapkv)").facts["windowed"]
    assert REGISTRY[f"{name}(loki)"].calibrates
    assert REGISTRY[name].peer == ("ChunkKVPress" if name == "chunkkv" else "EntropyGatedChunkKVPress")


@pytest.mark.parametrize("chunk", [7, 20, 33])
def test_chunk_length_is_a_setting(chunk) -> None:
    """ChunkKVPress(chunk_length=…): chunkkv configured with another chunk keeps the numpy formula's chunks of it."""
    from spectra.kv.presses.fields import configured

    prefill, _ = make_prefill(length=107)
    press = configured(REGISTRY["chunkkv(knorm)"], chunk_length=chunk)
    expected = numpy_chunkkv(REGISTRY["knorm"].score(prefill, 0.5).numpy(), 0.5, chunk)
    np.testing.assert_array_equal(press.compress(prefill, 0.5).kept[0].numpy(), expected)
    assert REGISTRY["chunkkv(knorm)"].chunk_length == 20 and press.fresh().chunk_length == chunk
