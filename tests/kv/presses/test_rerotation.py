"""key_rerotation against numpy formulas written here from kvpress 0.5.5's KeyRerotationPress: the inner scorer's
top n_kept tokens per head, in position order, the j-th kept key rotated to position j (R(j) of the key before RoPE,
and equally R(j − p_j) of the cached key, kvpress's route), values unchanged, the continuation starting at m."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept

from .conftest import DIM, make_prefill

THETA = 10000.0


def numpy_cos_sin(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RoPE's cos and sin (…, d) at `positions` (…,): angle p · θ^(−2i/d) for channel i and d/2 + i."""
    inv_freq = THETA ** (-np.arange(0, DIM, 2) / DIM)
    angles = positions[..., None] * inv_freq
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def numpy_rotate(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x (…, n, d) rotated to `positions` (…, n): x·cos + rotate_half(x)·sin."""
    cos, sin = numpy_cos_sin(positions.astype(np.float64))
    half = np.concatenate([-x[..., DIM // 2:], x[..., :DIM // 2]], axis=-1)
    return x * cos + half * sin


def torch_rope(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rope a Prefill carries (positions (n,) → cos, sin (n, d)), as a model's rotary module computes it."""
    inv_freq = THETA ** (-torch.arange(0, DIM, 2, dtype=torch.float64) / DIM)
    angles = positions.double()[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotary_prefill(length: int = 100, seed: int = 0):
    """A synthetic prefill whose cached keys are its keys before RoPE rotated to positions 0 … L − 1."""
    prefill, arrays = make_prefill(length, seed)
    key_pre = arrays["k"]
    key = numpy_rotate(key_pre, np.broadcast_to(np.arange(length), key_pre.shape[:2]))
    return replace(prefill, key=torch.from_numpy(key), key_pre=torch.from_numpy(key_pre), rope=torch_rope), \
        {**arrays, "key": key}


@pytest.mark.parametrize("scorer", ["knorm", "snapkv", "keydiff", "random"])
@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_the_kept_keys_are_rotated_to_contiguous_positions(scorer, ratio) -> None:
    prefill, arrays = rotary_prefill()
    part = REGISTRY[f"key_rerotation({scorer})"].compress(prefill, ratio)
    keep = n_kept(100, ratio)
    inner = REGISTRY[scorer].compress(prefill, ratio)
    torch.testing.assert_close(part.kept, inner.kept, rtol=0, atol=0)  # the scorer's tokens, in position order
    kept = part.kept.numpy()
    assert kept.shape == (2, keep) and (np.diff(kept, axis=-1) > 0).all()
    assert part.start == keep and part.saved == pytest.approx(1 - keep / 100) and part.valid is None
    contiguous = np.broadcast_to(np.arange(keep), kept.shape)
    pre = np.take_along_axis(arrays["k"], kept[..., None], axis=1)
    np.testing.assert_allclose(part.key.numpy(), numpy_rotate(pre, contiguous), rtol=0, atol=1e-12)
    cached = np.take_along_axis(arrays["key"], kept[..., None], axis=1)  # kvpress's route: R(j − p_j) k_post
    np.testing.assert_allclose(part.key.numpy(), numpy_rotate(cached, contiguous - kept), rtol=0, atol=1e-10)
    keys, values = part.rows(prefill.key, prefill.value)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(arrays["v"], kept[..., None], axis=1))
    assert keys is part.key and int(part.memory(prefill)[0]) == keep * 2 * DIM * 8


def test_a_shifted_query_sees_the_rerotated_keys_as_the_original_ones_at_the_same_distance() -> None:
    """Attention depends on relative positions: query q at m + i over the rerotated keys equals query q at L + i over
    keys placed at L − m + j — a check of the rotation's sign."""
    prefill, arrays = rotary_prefill(40)
    part = REGISTRY["key_rerotation(knorm)"].compress(prefill, 0.5)
    query = np.random.default_rng(1).standard_normal(DIM)
    at_start = numpy_rotate(query[None], np.array([part.start + 3])) @ part.key[0].numpy().T
    pre = arrays["k"][0, part.kept[0].numpy()]
    moved = numpy_rotate(pre, np.arange(part.start) + 40 - part.start)
    np.testing.assert_allclose(at_start, numpy_rotate(query[None], np.array([43])) @ moved.T, rtol=1e-10)


def test_bad_input() -> None:
    prefill, _ = rotary_prefill()
    with pytest.raises(ValueError, match="needs a scorer"):
        REGISTRY["key_rerotation"].compress(prefill, 0.5)
    with pytest.raises(ValueError, match="keys before RoPE and the model's RoPE"):
        REGISTRY["key_rerotation(knorm)"].compress(replace(prefill, key_pre=None), 0.5)
    with pytest.raises(SpectraError, match="key_rerotation wraps a scorer press, and 'kivi2' is not one"):
        REGISTRY.resolve("key_rerotation(kivi2)")
    with pytest.raises(SpectraError, match="'adakv\\(knorm\\)' is not one"):
        REGISTRY.resolve("key_rerotation(adakv(knorm))")


def test_its_facts() -> None:
    press = REGISTRY["key_rerotation(snapkv)"]
    assert press.needs_rope and press.windowed and press.peer == "KeyRerotationPress"
    facts = REGISTRY.facts("key_rerotation(knorm)")
    assert facts["needs_rope"] and facts["peer"] == "KeyRerotationPress" and "scorer" not in facts
    assert REGISTRY["key_rerotation(loki)"].fresh().inner is not REGISTRY["loki"]
