"""`chunk(<rowscorer>)` against a numpy formula written here from kvpress 0.5.5's ChunkPress: each chunk of 1024
tokens scored alone by the scorer, keeping its own max(1, int(c · (1 − r))) best; `restricted`, the prefill of a
subset of rows that the row scorers score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, Prefill
from spectra.kv.presses.chunk import chunked_keep, restricted
from spectra.registry import PRESSES

from .conftest import make_prefill

ROWSCORERS = ["streaming", "knorm", "keydiff", "random", "lagkv", "pca_leverage"]


def rows_prefill(length: int, seed: int = 0) -> Prefill:
    """A prefill of random keys and values (2 key/value heads, 6 query heads) with one query row: enough for a row
    scorer, at lengths where a dense P would not be."""
    rng = np.random.default_rng(seed)
    k = torch.from_numpy(rng.standard_normal((2, length, 8)) * rng.uniform(0.5, 2.0, (2, length, 1)))
    v = torch.from_numpy(rng.standard_normal((2, length, 8)))
    return Prefill(0, torch.zeros(6, 1, 8, dtype=k.dtype), k, v, None, torch.zeros(6, 1, length, dtype=k.dtype),
                   8 ** -0.5, 7, 3)


def numpy_knorm(keys: np.ndarray) -> np.ndarray:
    return -np.sqrt((keys ** 2).sum(-1))


def numpy_keydiff(keys: np.ndarray) -> np.ndarray:
    norms = np.sqrt((keys ** 2).sum(-1))
    anchor = (keys / norms[..., None]).mean(axis=-2)
    return -(keys @ anchor) / (norms * np.linalg.norm(anchor))


def numpy_chunked(keys: np.ndarray, ratio: float, score, chunk: int = 1024) -> np.ndarray:
    """(H_kv, m) ascending: per head, each chunk's int(c · (1 − r)) best (at least one) by `score` of its keys."""
    heads, length, _ = keys.shape
    kept = []
    for head in range(heads):
        mine = []
        for start in range(0, length, chunk):
            scores = score(keys[head, start:start + chunk])
            mine += list(start + np.argsort(-scores, kind="stable")[:max(1, int(scores.size * (1 - ratio)))])
        kept.append(sorted(mine))
    return np.array(kept)


@pytest.mark.parametrize("scorer, formula", [("knorm", numpy_knorm), ("keydiff", numpy_keydiff)])
@pytest.mark.parametrize("length", [1024, 1500, 2100])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_each_chunk_keeps_its_share_of_the_numpy_formulas_best(scorer, formula, length, ratio) -> None:
    prefill = rows_prefill(length)
    part = REGISTRY[f"chunk({scorer})"].compress(prefill, ratio)
    expected = numpy_chunked(prefill.key.numpy(), ratio, formula)
    np.testing.assert_array_equal(part.kept.numpy(), expected)
    shares = [max(1, int(min(1024, length - start) * (1 - ratio))) for start in range(0, length, 1024)]
    assert part.kept.shape[-1] == sum(shares) and part.saved == pytest.approx(1 - sum(shares) / length)


@pytest.mark.parametrize("scorer", ROWSCORERS)
def test_a_context_of_one_chunk_is_the_scorer_alone(scorer) -> None:
    prefill, _ = make_prefill(length=300)
    for ratio in (0.25, 0.5):
        part, alone = REGISTRY[f"chunk({scorer})"].compress(prefill, ratio), REGISTRY[scorer].compress(prefill, ratio)
        assert torch.equal(part.kept, alone.kept)


def test_streaming_keeps_each_chunks_sinks_and_its_most_recent() -> None:
    prefill, _ = make_prefill(length=100)
    kept = chunked_keep(REGISTRY["chunk(streaming)"], prefill, 0.5, chunk=40)  # chunks of 40, 40, 20: keep 20, 20, 10
    expected = [*range(4), *range(24, 40), *range(40, 44), *range(64, 80), *range(80, 84), *range(94, 100)]
    assert kept[0].tolist() == expected and kept[1].tolist() == expected


def test_small_chunks_keep_the_numpy_formulas_best() -> None:
    prefill = rows_prefill(95, seed=2)
    kept = chunked_keep(REGISTRY["chunk(knorm)"], prefill, 0.6, chunk=30)
    np.testing.assert_array_equal(kept.numpy(), numpy_chunked(prefill.key.numpy(), 0.6, numpy_knorm, chunk=30))


@pytest.mark.parametrize("scorer", ROWSCORERS)
def test_the_restricted_prefill_of_all_rows_scores_as_the_prefill(scorer) -> None:
    prefill, _ = make_prefill(length=300)
    rows = torch.arange(300).expand(2, -1)
    torch.testing.assert_close(REGISTRY[scorer].score(restricted(prefill, rows), 0.4),
                               REGISTRY[scorer].score(prefill, 0.4), rtol=0, atol=0)


def test_restricted_gathers_each_heads_rows_in_their_order() -> None:
    prefill, arrays = make_prefill(length=50)
    rows = torch.tensor([[7, 3, 40], [0, 49, 2]])
    sub = restricted(prefill, rows)
    assert sub.length == 3 and sub.key_pre is None and sub.q.shape == (6, 0, 8)
    for head in range(2):
        np.testing.assert_array_equal(sub.key[head].numpy(), arrays["k"][head, rows[head]])
        np.testing.assert_array_equal(sub.value[head].numpy(), arrays["v"][head, rows[head]])
    assert not sub.passes and prefill.passes, "no received attention: a scorer reading it is no row scorer"
    part = restricted(prefill, slice(10, 20))
    assert part.length == 10 and torch.equal(part.key, prefill.key[:, 10:20])
    assert torch.equal(part.value, restricted(prefill, torch.arange(10, 20).expand(2, -1)).value)


@pytest.mark.parametrize("name", ["chunk", "block"])
@pytest.mark.parametrize("scorer", ["snapkv", "tova", "observed", "loki", "think", "adakv(knorm)"])
def test_scorers_reading_queries_are_refused_before_anything_loads(name, scorer) -> None:
    with pytest.raises(SpectraError, match=f"{name} wraps a rowscorer press, and '.*' is not one; rowscorers: "
                                           "streaming, knorm, random, keydiff"):
        PRESSES.resolve(f"{name}({scorer})")
    with pytest.raises(SpectraError, match="not one"):
        PRESSES.resolve(f"adakv({name}(knorm))")
    assert sorted(PRESSES.having("rowscorer")) == sorted(ROWSCORERS)
    assert REGISTRY[name].peer == {"chunk": "ChunkPress", "block": "BlockPress"}[name]
