"""KIVI against numpy written here group by group: keys per channel in groups of G tokens, values per token in
groups of G channels, asymmetric min/scale codes, the last L mod R keys and the last R values in full precision, and
the bytes such a cache stores counted by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.kv.presses import REGISTRY, Prefill
from spectra.kv.presses.kivi import Kivi, fake_quantize

from .conftest import make_prefill


def numpy_group(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """One group's dequantized numbers and codes: z = min, s = (max − min)/(2^b − 1), c = round((x − z)/s)."""
    low, high = x.min(), x.max()
    scale = (high - low) / (2 ** bits - 1)
    codes = np.zeros_like(x) if scale == 0 else np.clip(np.round((x - low) / scale), 0, 2 ** bits - 1)
    return codes * scale + low, codes


def numpy_kivi(k: np.ndarray, v: np.ndarray, bits: int, group: int, residual: int) -> tuple[np.ndarray, np.ndarray]:
    heads, length, dim = k.shape
    keys, values = k.copy(), v.copy()
    quantized_keys = length - length % residual
    quantized_values = max(length - residual, 0)
    for head in range(heads):
        for channel in range(dim):
            for start in range(0, quantized_keys, group):
                stop = min(start + group, quantized_keys)
                keys[head, start:stop, channel] = numpy_group(k[head, start:stop, channel], bits)[0]
        for token in range(quantized_values):
            for start in range(0, dim, group):
                values[head, token, start:start + group] = numpy_group(v[head, token, start:start + group], bits)[0]
    return keys, values


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("length", [300, 100])
def test_kivi_quantizes_keys_per_channel_and_values_per_token(bits: int, length: int) -> None:
    prefill, arrays = make_prefill(length=length)
    press = Kivi(bits, group=4, residual=64)  # d = 8: two value groups per token; 300 mod 64 = 44 keys unquantized
    got = press.compress(prefill, 0.5)
    keys, values = numpy_kivi(arrays["k"], arrays["v"], bits, 4, 64)
    np.testing.assert_allclose(got.key.numpy(), keys, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.value.numpy(), values, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got.key.numpy()[:, length - length % 64:], arrays["k"][:, length - length % 64:])
    np.testing.assert_array_equal(got.value.numpy()[:, length - 64:], arrays["v"][:, length - 64:])
    assert not np.allclose(got.key.numpy(), arrays["k"]) and not np.allclose(got.value.numpy(), arrays["v"])
    np.testing.assert_array_equal(got.kept.numpy(), np.tile(np.arange(length), (2, 1)))


def test_every_group_holds_at_most_two_to_the_bits_values_within_half_a_step() -> None:
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((5, 70)))
    for bits in (2, 4, 8):
        out = fake_quantize(x, bits, 32).numpy()
        for start in range(0, 70, 32):  # groups 0–31, 32–63, 64–69
            group, original = out[:, start:start + 32], x.numpy()[:, start:start + 32]
            step = (original.max(-1) - original.min(-1)) / (2 ** bits - 1)
            assert all(len(np.unique(row)) <= 2 ** bits for row in group)
            assert np.all(np.abs(group - original) <= step[:, None] / 2 * (1 + 1e-9))
            np.testing.assert_allclose(group.min(-1), original.min(-1), atol=1e-12)
            np.testing.assert_allclose(group.max(-1), original.max(-1), atol=1e-12)
    constant = torch.full((2, 8), 3.5, dtype=torch.float64)
    assert torch.equal(fake_quantize(constant, 2, 4), constant), "a constant group keeps its value"


def test_bytes_are_the_codes_the_scales_and_zero_points_and_the_full_precision_rows() -> None:
    prefill, _ = make_prefill(length=300)  # float64: 8 bytes a number; d = 8
    for bits in (2, 4, 8):
        press = Kivi(bits, group=4, residual=64)
        # keys: 256 tokens × 8 channels quantized (64 groups of 4 tokens per channel → 512 groups), 44 rows full
        keys = 256 * 8 * bits // 8 + 2 * 8 * (256 // 4) * 8 + 44 * 8 * 8
        # values: 236 tokens quantized, 2 groups of 4 channels each → 472 groups, 64 rows full
        values = 236 * 8 * bits // 8 + 2 * 236 * 2 * 8 + 64 * 8 * 8
        got = press.compress(prefill, 0.3)
        assert got.memory(prefill).tolist() == [keys + values] * 2
        assert got.saved == pytest.approx(1 - (keys + values) / (300 * 16 * 8))


def test_the_registered_variants_are_kivis_defaults() -> None:
    for bits in (2, 4, 8):
        press = REGISTRY[f"kivi{bits}"]
        assert (press.bits, press.group, press.residual, press.axis) == (bits, 32, 128, "bits")
        assert press.fresh() is press and press.name == f"kivi{bits}" and str(bits) in press.summary


def test_the_ratio_changes_nothing_and_a_short_context_stays_whole() -> None:
    prefill, _ = make_prefill(length=100)
    press = REGISTRY["kivi2"]
    a, b = press.compress(prefill, 0.25), press.compress(prefill, 0.9)
    assert torch.equal(a.key, b.key) and torch.equal(a.value, b.value) and a.saved == b.saved
    # L = 100 < R = 128: nothing is quantized yet, the cache is the prefill's own
    assert torch.equal(a.key, prefill.key) and torch.equal(a.value, prefill.value) and a.saved == 0


def test_float32_keys_quantize_in_float32() -> None:
    prefill, arrays = make_prefill(length=200)
    single = Prefill(0, prefill.q.float(), prefill.key.float(), prefill.value.float(), None, prefill.window.float(),
                     prefill.scaling, 0, 0)
    got = Kivi(4, group=8, residual=64).compress(single, 0.5)
    keys, values = numpy_kivi(arrays["k"].astype(np.float32), arrays["v"].astype(np.float32), 4, 8, 64)
    assert got.key.dtype == torch.float32
    np.testing.assert_allclose(got.key.numpy(), keys, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.value.numpy(), values, rtol=0, atol=1e-5)
    assert got.memory(single)[0] == Kivi(4, group=8, residual=64).memory(single)
