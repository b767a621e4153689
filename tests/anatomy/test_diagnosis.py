"""Every diagnosis score against a loop over queries and keys in numpy, on random P with padding (left and right),
causal and bidirectional."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectra.anatomy.diagnosis import (
    INDUCTION_SEQUENCES,
    INDUCTION_TOKENS,
    ROW_SCORES,
    energy_rank,
    induction_stripe,
    induction_tokens,
    retrieval_scores,
    row_scores,
    streaming_p,
)
from spectra.spectrum import row_metrics


def random_layer(causal: bool, seed: int = 0, batch: int = 3, heads: int = 2, n: int = 24, d: int = 4):
    """Softmax P of random scores over the valid keys (a causal mask for decoders), keys and values; sequence 1 is
    padded on the left by 5, sequence 2 on the right by 7."""
    rng = np.random.default_rng(seed)
    valid = np.ones((batch, n), bool)
    valid[1, :5] = False
    valid[2, n - 7:] = False
    scores = rng.standard_normal((batch, heads, n, n)) * 3
    rank = np.cumsum(valid, -1) - 1
    allowed = valid[:, None, :, None] & valid[:, None, None, :]
    if causal:
        allowed = allowed & (rank[:, None, None, :] <= rank[:, None, :, None])
    scores = np.where(allowed, scores, -np.inf)
    scores[:, :, 0, 0] = np.where(allowed[:, :, 0, 0], scores[:, :, 0, 0], 0)
    with np.errstate(invalid="ignore"):  # padded rows see no key: all −inf
        p = np.where(allowed, np.exp(scores - scores.max(-1, keepdims=True)), 0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    key = rng.standard_normal((batch, heads, n, d))
    value = rng.standard_normal((batch, heads, n, d))
    return p, key, value, valid


def reference_rows(p, key, valid, causal, start, eps, window):
    """ROW_SCORES by loops: every sum written out per query and key."""
    batch, heads, n, _ = p.shape
    out = np.zeros((batch, heads, len(ROW_SCORES)))
    for b in range(batch):
        where = np.flatnonzero(valid[b])  # valid positions in order: rank r is where[r]
        m = len(where)
        queries = range(min(start, m - 1), m)
        for h in range(heads):
            rows = p[b, h][np.ix_(where, where)]  # m × m in ranks
            share = np.mean([rows[i, 0] > eps for i in queries])
            prev = np.mean([rows[i, i - 1] for i in queries])
            local = np.mean([sum(rows[i, j] for j in range(m) if abs(i - j) < window) for i in queries])
            top = []
            for i in queries:
                seen = rows[i, : i + 1] if causal else rows[i]
                top.append(np.sort(seen)[::-1][: math.ceil(len(seen) / 10)].sum())
            received = [np.mean([rows[i, j] for i in range(m) if (i >= j or not causal)]) for j in range(m)]
            norms = np.linalg.norm(key[b, h][where], axis=-1)
            corr = np.corrcoef(received, norms)[0, 1]
            out[b, h] = [share, prev, local, np.mean(top), corr]
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_row_scores_equal_the_loops(causal) -> None:
    p, key, value, valid = random_layer(causal)
    found = row_scores(torch.tensor(p), torch.tensor(key), torch.tensor(valid), causal, 4, 0.3, 5).numpy()
    np.testing.assert_allclose(found, reference_rows(p, key, valid, causal, 4, 0.3, 5), rtol=1e-10, atol=1e-12)


def test_sink_share_counts_the_queries_above_eps_from_the_sink_start() -> None:
    p = torch.zeros(1, 1, 6, 6)
    p[0, 0, :, 0] = torch.tensor([1.0, 0.5, 0.2, 0.35, 0.31, 0.29])
    p[0, 0, :, 1] = 1 - p[0, 0, :, 0]
    valid = torch.ones(1, 6, dtype=torch.bool)
    share = row_scores(p, torch.randn(1, 1, 6, 2), valid, True, 2, 0.3, 64)[0, 0, 0]
    assert share == pytest.approx(2 / 4), "queries 2…5: 0.35 and 0.31 exceed 0.3"


def test_sink_share_and_the_sink_mass_take_the_same_queries() -> None:
    p, key, _, valid = random_layer(True, seed=3)
    found = row_scores(torch.tensor(p), torch.tensor(key), torch.tensor(valid), True, 4, 0.0, 5)
    assert torch.all(found[..., 0] == 1), "ε = 0: every chosen query puts something on the first token"
    mass = row_metrics(torch.tensor(p), torch.tensor(valid), 4)[..., 0]
    for b in range(p.shape[0]):
        where = np.flatnonzero(valid[b])
        np.testing.assert_allclose(mass[b].numpy(), p[b][:, where[4:], where[0]].mean(-1), rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_retrieval_is_the_layer_output_change_of_streaming_one_head(causal) -> None:
    p, _, value, valid = random_layer(causal, seed=1, n=20)
    batch, heads, n, d = value.shape
    rng = np.random.default_rng(2)
    w_o, b_o = rng.standard_normal((5, heads * d)), rng.standard_normal(5)
    sinks, recent = 2, 4
    found = retrieval_scores(torch.tensor(p), torch.tensor(value), torch.tensor(valid), torch.tensor(w_o),
                             torch.tensor(b_o), sinks, recent).numpy()
    for b in range(batch):
        where = np.flatnonzero(valid[b])
        m = len(where)
        rows = p[b][:, where][:, :, where]  # (H, m, m)
        values = value[b][:, where]
        out = np.concatenate([rows[h] @ values[h] for h in range(heads)], axis=1) @ w_o.T + b_o
        for h in range(heads):
            kept = np.array([[j < sinks or abs(i - j) < recent for j in range(m)] for i in range(m)])
            streamed = rows[h] * kept
            streamed = streamed / streamed.sum(-1, keepdims=True)
            changed = [rows[g] @ values[g] if g != h else streamed @ values[g] for g in range(heads)]
            moved = np.concatenate(changed, axis=1) @ w_o.T + b_o - out
            assert found[b, h] == pytest.approx(np.linalg.norm(moved) / np.linalg.norm(out), rel=1e-9)


def test_streaming_keeps_the_whole_row_when_the_window_covers_it() -> None:
    p, _, _, valid = random_layer(True, n=12)
    np.testing.assert_allclose(streaming_p(torch.tensor(p), torch.tensor(valid), 0, 12).numpy(), p, rtol=1e-12)


def test_induction_tokens_repeat_a_seeded_random_block_after_bos() -> None:
    tokens = induction_tokens(100, [0, 1, 2], 1, seed=5)
    assert tokens.shape == (INDUCTION_SEQUENCES, 1 + 2 * INDUCTION_TOKENS) and (tokens[:, 0] == 1).all()
    first, second = tokens[:, 1:1 + INDUCTION_TOKENS], tokens[:, 1 + INDUCTION_TOKENS:]
    np.testing.assert_array_equal(first, second)
    assert first.min() >= 3 and first.max() < 100, "special tokens are never drawn"
    np.testing.assert_array_equal(tokens, induction_tokens(100, [0, 1, 2], 1, seed=5))
    assert not np.array_equal(tokens, induction_tokens(100, [0, 1, 2], 1, seed=6))
    assert induction_tokens(100, [], None, seed=5).shape == (INDUCTION_SEQUENCES, 2 * INDUCTION_TOKENS)


def test_induction_stripe_reads_the_token_after_the_first_occurrence() -> None:
    length, offset = INDUCTION_TOKENS, 1
    n = offset + 2 * length
    p = torch.rand(2, 3, n, n)
    expected = np.mean([p[..., i, i - length + 1].numpy() for i in range(offset + length, n)], axis=0)
    np.testing.assert_allclose(induction_stripe(p, offset).numpy(), expected, rtol=1e-6)


def test_energy_rank_is_the_first_index_whose_share_reaches_the_energy() -> None:
    sigma = np.array([[5.0, 3.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(energy_rank(sigma, 0.9), [3, 4, 0])
    np.testing.assert_array_equal(energy_rank(sigma, 0.5), [1, 2, 0])
