"""Informer's ProbSparse against its selection rule written densely in numpy, its exact limit and nesting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from layers import H, N, approximate, draws, exact_on_valid_rows, head, random_layer, softmax
from spectra.methods import probsparse
from spectra.seeds import Domain, derive_seed

LENGTHS = (N, 7)
S = 0.7  # the score scale s


def layer(lengths=LENGTHS, n=N, seed=0, spread=1.0):
    """Padded float64 layer; P computed from q and k (as a substitution sees it)."""
    return random_layer(lengths, n=n, seed=seed, spread=spread, scaling=S, use_p=False)


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("budget", [1, 4, 7])
def test_probsparse_is_top_u_exact_rows_and_mean_v(budget, fixed) -> None:
    x = layer()
    approx_ = approximate("probsparse", x, budget, draws(x, fixed=fixed))
    positions, used = probsparse.probsparse_sample(x, draws(x, fixed=fixed))
    for b, m in enumerate(LENGTHS):
        count = min(5 * math.ceil(math.log(m)), m)
        assert int(used[b].sum()) == count
        for h in range(H):
            q, k, v = head(x, b, h, m)
            sample = positions[b, h, :m, :count].numpy()
            assert sample.max() < m, "only valid keys are sampled"
            s = q @ k.T * S
            sampled = np.take_along_axis(s, sample, axis=1)
            sparsity = sampled.max(1) - sampled.mean(1)
            top = set(np.argsort(-sparsity, kind="stable")[:budget])
            want = np.stack([softmax(s[i]) if i in top else np.full(m, 1 / m) for i in range(m)])
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), want, atol=1e-12)
            assert np.allclose(approx_.out[b, h, :m].numpy(), want @ v, atol=1e-12)
            lazy = [i for i in range(m) if i not in top]
            assert np.allclose(approx_.out[b, h, lazy].numpy(), v.mean(0), atol=1e-12)


def test_probsparse_with_every_query_active_is_exact() -> None:
    x = layer()
    assert exact_on_valid_rows(x, approximate("probsparse", x, N), atol=1e-12)
    seven = approximate("probsparse", x, 7)  # u = 7 ≥ m covers the padded sequence
    assert torch.allclose(seven.out[1] * x.valid[1, None, :, None], (x.p @ x.v)[1])


@pytest.mark.parametrize("fixed", [True, False])
def test_probsparse_selections_are_nested_across_budgets(fixed) -> None:
    x = layer()
    active = [(approximate("probsparse", x, u, draws(x, fixed=fixed)).p - x.p).abs().sum(-1) == 0 for u in (2, 4, 6)]
    assert all((small <= large).all() for small, large in zip(active, active[1:]))


def sampled_keys(seed: int, layer: int, head: int, n: int, m: int, sequence: int | None) -> np.ndarray:
    """The keys (n, c) each query samples, drawn here from the documented seeds: ⌊u·m⌋ with u from one generator per
    (seed, layer, head, the sequence's global index) filling an (n, c) block row by row; fixed (sequence None):
    column t from its own generator per (seed, layer, head, t)."""
    count = min(5 * math.ceil(math.log(m)), m)
    if sequence is None:
        u = np.stack([np.random.default_rng(derive_seed(seed, Domain.PROBSPARSE, layer, head, t)).random(n)
                      for t in range(count)], axis=-1)
    else:
        u = np.random.default_rng(derive_seed(seed, Domain.PROBSPARSE, layer, head, sequence)).random((n, count))
    return np.minimum(np.floor(u * m).astype(np.int64), m - 1)


def test_each_sequence_samples_its_own_keys() -> None:
    """Per sequence: the sampled keys are seeded by the sequence's global index (two sequences of the same length
    get different ones, and each the same as alone); fixed: the draws shared by every sequence, as before
    per-sequence draws existed (the fixed-projection regression case stays bitwise)."""
    index, lengths = (4, 11, 6), (N, 7, N)
    x = layer(lengths)
    drawn, used = probsparse.probsparse_sample(x, draws(x, index=index, fixed=False))
    fixed = probsparse.probsparse_sample(x, draws(x, index=index, fixed=True))[0]
    for b, (m, sequence) in enumerate(zip(lengths, index)):
        count = int(used[b].sum())
        for h in range(H):
            assert np.array_equal(drawn[b, h, :, :count].numpy(), sampled_keys(0, 3, h, N, m, sequence))
            assert np.array_equal(fixed[b, h, :, :count].numpy(), sampled_keys(0, 3, h, N, m, None))
        alone = layer((m,), n=m, seed=b)
        sample = probsparse.probsparse_sample(alone, draws(alone, index=(sequence,), fixed=False))[0]
        assert torch.equal(sample[0, :, :, :count], drawn[b, :, :m, :count])
    assert not torch.equal(drawn[0], drawn[2]) and torch.equal(fixed[0], fixed[2])
