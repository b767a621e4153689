"""`leverage` against a dense numpy computation of kvpress 0.5.5's LeverageScorePress formula: per key/value head the
centred pre-RoPE keys sketched on the right, X Φ, then diag(X Φ (ΦᵀXᵀXΦ + λI)⁻¹ ΦᵀXᵀ) clamped at 0 and z-scored over
the layer, Φ what torch's global generator draws at that layer once seeded with `Leverage.seed_of(seed, index)`; the
ridge raised tenfold while the Cholesky factorisation fails; the rows it keeps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.leverage import SKETCH, Leverage, sketched_leverage, sketches

from .conftest import DIM, KV_HEADS, make_prefill


def numpy_leverage(keys: np.ndarray, sketch: np.ndarray, ridge: float = 1e-2) -> np.ndarray:
    """diag(Y (YᵀY + λI)⁻¹ Yᵀ) per head, Y the centred keys times the sketch, clamped at 0 (float64, an explicit
    inverse: no Cholesky)."""
    out = []
    for k, phi in zip(keys, sketch):
        y = (k - k.mean(axis=0)) @ phi
        out.append(np.einsum("jk,kl,jl->j", y, np.linalg.inv(y.T @ y + ridge * np.eye(y.shape[1])), y))
    return np.clip(np.array(out), 0, None)


def z(scores: np.ndarray) -> np.ndarray:
    return (scores - scores.mean()) / max(scores.std(ddof=1), 1e-6)


def kvpress_sketch(seed: int, layer: int, heads: int, dim: int) -> np.ndarray:
    """(H_kv, d, 48) what LeverageScorePress draws at `layer` of a prefill after torch.manual_seed(seed): the global
    generator's (layer + 1)-th torch.randn(1, H_kv, d, 48) (float32 keys), times 1/√48."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for _ in range(layer + 1):
            phi = torch.randn(1, heads, dim, SKETCH, dtype=torch.float32) * (1 / np.sqrt(SKETCH))
    return phi[0].double().numpy()


def with_keys(dim: int, layer: int = 0, length: int = 60, seed: int = 0):
    """A float32 prefill whose cached and pre-RoPE keys are (KV_HEADS, length, dim), the pre-RoPE ones spread unevenly
    over their channels and off the origin; and those pre-RoPE keys."""
    prefill, _ = make_prefill(length=length, seed=seed)
    rng = np.random.default_rng(seed + 100)
    pre = (rng.standard_normal((KV_HEADS, length, dim)) * rng.uniform(0.1, 3.0, (KV_HEADS, 1, dim)) + 1.5)
    pre = pre.astype(np.float32)
    cached = rng.standard_normal((KV_HEADS, length, dim)).astype(np.float32)
    return dataclasses.replace(prefill, layer=layer, key=torch.from_numpy(cached), key_pre=torch.from_numpy(pre)), pre


def test_the_sketches_are_what_the_seeded_global_generator_draws_layer_by_layer() -> None:
    shape = (1, KV_HEADS, DIM, SKETCH)
    with torch.random.fork_rng():
        torch.manual_seed(1234)  # what kvpress's LeverageScorePress draws at layers 0, 1, 2 of a prefill
        drawn = [torch.randn(shape) * (1 / np.sqrt(SKETCH)) for _ in range(3)]
    for layer in range(3):
        assert torch.equal(sketches(1234, layer, shape, torch.float32), drawn[layer])
    assert not torch.equal(drawn[0], drawn[1])
    assert Leverage.seed_of(0, 3) != Leverage.seed_of(0, 4) != Leverage.seed_of(1, 4)


@pytest.mark.parametrize("dim, layer", [(DIM, 0), (64, 2)])  # a sketch wider than d (a singular Gram), and narrower
def test_scores_equal_kvpress_formula_computed_densely(dim: int, layer: int) -> None:
    prefill, pre = with_keys(dim, layer)
    got = REGISTRY["leverage"].score(prefill, 0.5)
    assert got.shape == (KV_HEADS, 60) and got.dtype == torch.float32
    sketch = kvpress_sketch(Leverage.seed_of(prefill.seed, prefill.index), layer, KV_HEADS, dim)
    reference = z(numpy_leverage(pre.astype(np.float64), sketch))
    np.testing.assert_allclose(got.numpy(), reference, rtol=1e-4, atol=2e-4)
    assert abs(float(got.mean())) < 1e-5 and abs(float(got.std()) - 1) < 1e-5  # z-scored over both heads at once


def test_the_press_keeps_the_top_scores_of_the_pre_rope_keys_per_head() -> None:
    prefill, pre = with_keys(DIM, layer=1, seed=4)
    sketch = kvpress_sketch(Leverage.seed_of(prefill.seed, prefill.index), 1, KV_HEADS, DIM)
    reference = numpy_leverage(pre.astype(np.float64), sketch)
    keep = n_kept(60, 0.5)
    ordered = -np.sort(-reference, axis=-1)
    assert (ordered[:, keep - 1] - ordered[:, keep] > 1e-4).all(), "no near tie at the cut: float32 cannot swap it"
    kept = REGISTRY["leverage"].compress(prefill, 0.5).kept.numpy()
    np.testing.assert_array_equal(kept, np.sort(np.argsort(-reference, axis=-1)[:, :keep], axis=-1))
    without = REGISTRY["leverage"].compress(dataclasses.replace(prefill, key_pre=None), 0.5).kept.numpy()
    assert not np.array_equal(without, kept), "the keys before RoPE, not the cached ones, when given"
    other = REGISTRY["leverage"].score(dataclasses.replace(prefill, index=prefill.index + 1), 0.5)
    assert not torch.allclose(other, REGISTRY["leverage"].score(prefill, 0.5)), "another sequence, another sketch"


def test_the_ridge_rises_tenfold_while_the_cholesky_factorisation_fails(monkeypatch) -> None:
    rng = np.random.default_rng(8)
    keys = rng.standard_normal((KV_HEADS, 40, DIM)) * rng.uniform(0.2, 2.0, DIM)
    sketch = rng.standard_normal((KV_HEADS, DIM, 6)) / np.sqrt(6)
    factorise, tried = torch.linalg.cholesky_ex, []

    def failing_twice(matrix: torch.Tensor, **kwargs):
        tried.append(matrix)
        factor, info = factorise(matrix, **kwargs)
        return factor, info + (1 if len(tried) <= 2 else 0)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", failing_twice)
    got = sketched_leverage(torch.from_numpy(keys), torch.from_numpy(sketch))
    ridges = [float((m - tried[0]).diagonal(dim1=-2, dim2=-1).mean()) for m in tried]
    np.testing.assert_allclose(ridges, [0.0, 0.09, 0.99], atol=1e-4)  # λ = 0.01, 0.1, 1: kvpress's jitter rule
    np.testing.assert_allclose(got.numpy(), numpy_leverage(keys, sketch, ridge=1.0), rtol=2e-4, atol=1e-6)
    monkeypatch.setattr(torch.linalg, "cholesky_ex", lambda matrix, **kwargs: (matrix, torch.ones(KV_HEADS)))
    with pytest.raises(ValueError, match="not positive definite"):
        sketched_leverage(torch.from_numpy(keys), torch.from_numpy(sketch))


def test_it_declares_kvpress_peer_and_is_no_row_scorer() -> None:
    press = REGISTRY["leverage"]
    assert press.peer == "LeverageScorePress" and press.scorer and not press.rowscorer
    assert REGISTRY["pca_leverage"].rowscorer and REGISTRY["pca_leverage"].peer == ""
