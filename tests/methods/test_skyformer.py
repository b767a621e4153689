"""Skyformer against a dense numpy Nyström of the Gaussian kernel reweighted into softmax, and its exact limit."""

from __future__ import annotations

import numpy as np
import pytest

from layers import H, N, exact_on_valid_rows, head, random_layer
from spectra.methods import REGISTRY, skyformer
from spectra.seeds import Domain, derive_seed

LENGTHS = (N, 7)
S = 0.7  # the score scale s


def layer(lengths=LENGTHS, n=N, seed=0, spread=1.0, **options):
    """Padded float64 layer; P computed from q and k (as a substitution sees it)."""
    return random_layer(lengths, n=n, seed=seed, spread=spread, scaling=S, use_p=False, **options)


def gaussian(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.exp(-S * ((x[:, None] - y[None]) ** 2).sum(-1) / 2)


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("budget", [4, 7])
def test_skyformer_is_reweighted_gaussian_nystrom(budget, fixed) -> None:
    x = layer(spread=0.7, fixed=fixed)
    approx_ = REGISTRY["skyformer"].run(x, budget)
    positions, present = skyformer.skyformer_landmarks(x, budget)
    half = budget - budget // 2
    for b, m in enumerate(LENGTHS):
        for h in range(H):
            q, k, v = head(x, b, h, m)
            at = positions[b, h].numpy()
            assert present[b].all() and len(set(at[:half])) == half and len(set(at[half:])) == budget - half
            assert at.max() < m, "landmarks are valid positions"
            landmarks = np.concatenate([q[at[:half]], k[at[half:]]])
            kernel = gaussian(q, landmarks) @ np.linalg.pinv(gaussian(landmarks, landmarks)) @ gaussian(landmarks, k)
            unnormalised = kernel * np.exp(S * (k * k).sum(-1) / 2)
            want = unnormalised / unnormalised.sum(-1, keepdims=True)
            assert np.allclose(approx_.p[b, h, :m, :m].numpy(), want, atol=1e-8)
            assert np.allclose(approx_.out[b, h, :m].numpy(), want @ v, atol=1e-8)
            # the same thing as a Nyström of the exponential kernel exp(s x·y) on these landmarks
            e = lambda a, c: np.exp(S * a @ c.T)  # noqa: E731
            direct = e(q, landmarks) @ np.linalg.inv(e(landmarks, landmarks)) @ e(landmarks, k)
            assert np.allclose(want, direct / direct.sum(-1, keepdims=True), atol=1e-6)


def test_skyformer_with_every_point_a_landmark_is_exact() -> None:
    x = layer(lengths=(6, 5), spread=0.5)  # k = 12 ≥ 2m: every valid query and key is a landmark
    assert exact_on_valid_rows(x, REGISTRY["skyformer"].run(x, N), atol=1e-7)


def landmark_ranks(seed: int, budget: int, layer: int, head: int, m: int, *sequence: int) -> np.ndarray:
    """The landmarks' ranks among the valid positions, drawn here from the documented seed: ⌈k/2⌉ then ⌊k/2⌋
    of a permutation of the m valid positions each, from one generator fixed by (seed, budget, layer, head, m[,
    the sequence's global index])."""
    rng = np.random.default_rng(derive_seed(seed, Domain.SKYFORMER, budget, layer, head, m, *sequence))
    return np.concatenate([rng.permutation(m)[:half] for half in (budget - budget // 2, budget // 2)])


@pytest.mark.parametrize("budget", [4, 7])
def test_each_sequence_samples_its_own_landmarks(budget) -> None:
    """Per sequence: landmarks seeded by the sequence's global index (three sequences, two of the same length,
    get different ones, and each the same as alone); fixed: one sample per length m, as before per-sequence
    draws existed (the fixed-projection regression case stays bitwise)."""
    index = (4, 11, 6)
    lengths = (N, 7, N)
    drawn = skyformer.skyformer_landmarks(layer(lengths, index=index, fixed=False), budget)[0].numpy()
    fixed = skyformer.skyformer_landmarks(layer(lengths, index=index, fixed=True), budget)[0].numpy()
    for b, (m, sequence) in enumerate(zip(lengths, index)):
        for h in range(H):
            assert np.array_equal(drawn[b, h], landmark_ranks(0, budget, 3, h, m, sequence))  # right padding
            assert np.array_equal(fixed[b, h], landmark_ranks(0, budget, 3, h, m))
        alone = layer((m,), n=m, seed=b, index=(sequence,), fixed=False)
        assert np.array_equal(skyformer.skyformer_landmarks(alone, budget)[0][0].numpy(), drawn[b])
    assert not np.array_equal(drawn[0], drawn[2]) and np.array_equal(fixed[0], fixed[2])
