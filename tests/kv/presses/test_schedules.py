"""Per-layer ratio schedules: PyramidKV's schedule against the kept counts kvpress 0.5.5 produced (SPEC.md, L = 256, 30
layers), water-filling against its definition, spectral schedules at equal total cache, weights from analyze tables,
the exported JSON list, and a scheduled press compressing each layer at its own ratio."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.schedules import (
    Scheduled,
    export,
    head_ratios,
    head_weights,
    kept_tokens,
    layer_weights,
    pyramid,
    pyramid_kept,
    ratio_keeping,
    spectral,
    uniform,
    water_fill,
)

from .conftest import make_prefill


@pytest.mark.parametrize("ratio, first, last, mean", [(0.1, 230, 230, 230), (0.25, 192, 192, 192),
                                                      (0.4, 192, 115, 153.6), (0.5, 192, 64, 128),
                                                      (0.6, 102, 102, 102), (0.75, 64, 64, 64)])
def test_pyramid_matches_kvpress_budgets(ratio: float, first: int, last: int, mean: float) -> None:
    kept = pyramid_kept(256, ratio, 30)
    assert (kept[0], kept[-1]) == (first, last) and np.mean(kept) == pytest.approx(mean, abs=0.05)
    assert kept == sorted(kept, reverse=True)
    assert pyramid_kept(256, 0.0, 30) == [256] * 30
    np.testing.assert_allclose(pyramid(30)(ratio, 256), [1 - k / 256 for k in kept])


def kvpress_n_kept(length: int, ratio: float) -> int:
    """kvpress 0.5.5's kvpress.utils.compute_n_kept, written out: what a PerLayerCompressionPress layer keeps."""
    return 0 if ratio >= 1 else max(1, int(length * (1 - ratio)))


def test_an_exported_ratio_keeps_exactly_its_count() -> None:
    """1 − n/L loses a token to int() for some n (at L = 448, r = 0.5, PyramidKV's layers 14, 15, 22 and 29: 6716
    tokens where kvpress's PyramidKVPress keeps 6720); the exported ratio gives kvpress's own count."""
    kept = pyramid_kept(448, 0.5, 30)
    assert sum(kept) == 6720
    assert sum(kvpress_n_kept(448, 1 - count / 448) for count in kept) == 6716, "the naive ratio loses 4 tokens"
    assert [kvpress_n_kept(448, ratio) for ratio in pyramid(30)(0.5, 448)] == kept
    for length in range(1, 1100):
        assert all(kvpress_n_kept(length, ratio_keeping(count, length)) == count for count in range(1, length + 1))
    assert ratio_keeping(448, 448) == 0.0 and ratio_keeping(103, 1024) == pytest.approx(1 - 103 / 1024, abs=1e-15)
    with pytest.raises(ValueError):
        ratio_keeping(0, 448)


@pytest.mark.parametrize("length", [448, 777, 1024])
@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5, 0.75, 0.9])
def test_every_schedule_keeps_its_counts_through_kvpress(length: int, ratio: float) -> None:
    counts = pyramid_kept(length, ratio, 30)
    assert [kvpress_n_kept(length, value) for value in pyramid(30)(ratio, length)] == counts
    weights = [float(layer % 7 + 1) for layer in range(30)]
    kept = [kvpress_n_kept(length, value) for value in spectral(weights)(ratio, length)]
    assert sum(kept) == 30 * kvpress_n_kept(length, ratio), "exactly the uniform ratio's tokens"


def test_water_fill_caps_and_redistributes_in_proportion() -> None:
    shares = water_fill([1.0, 1.0, 10.0, 2.0], 2.0)
    np.testing.assert_allclose(shares, [0.25, 0.25, 1.0, 0.5])
    free = water_fill([1.0, 2.0, 3.0], 1.2)
    np.testing.assert_allclose(free, [0.2, 0.4, 0.6])
    with pytest.raises(ValueError, match="cannot fit"):
        water_fill([1.0, 1.0], 2.5)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_spectral_schedules_keep_the_uniform_total(ratio: float) -> None:
    weights = [3.0, 30.0, 24.0, 6.0, 12.0]
    ratios = np.array(spectral(weights)(ratio, 1024))
    np.testing.assert_allclose((1 - ratios).mean(), 1 - ratio, atol=1 / 1024)
    assert ((0 <= ratios) & (ratios < 1)).all()
    shares = water_fill(weights, 5 * int(1024 * (1 - ratio)) / 1024)
    kept = np.array([kvpress_n_kept(1024, value) for value in ratios])
    assert (np.abs(kept - shares * 1024) < 1).all(), "proportional (water-filled) up to one whole token"
    assert kept_tokens(ratios, 1024) == kept_tokens(uniform(5)(ratio, 1024), 1024)


def analyze_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    layers, heads, kv_heads = 3, 4, 2
    rng = np.random.default_rng(0)
    metrics = pd.DataFrame([{"layer": layer, "head": head, "entropy_mean": rng.uniform(0.5, 3),
                             "sink_mean": rng.uniform(0, 0.9)} for layer in range(layers) for head in range(heads)])
    qkv = pd.DataFrame([{"tensor": "k", "stage": stage, "layer": layer, "head": head,
                         "pca_rank90": rng.integers(2, 40)} for stage in ("projection", "attention")
                        for layer in range(layers) for head in range(kv_heads)])
    return metrics, qkv


def test_weights_from_analyze_tables() -> None:
    metrics, qkv = analyze_tables()
    entropy = [np.exp(metrics[metrics.layer == layer].entropy_mean.mean()) for layer in range(3)]
    np.testing.assert_allclose(layer_weights("entropy", metrics), entropy)
    np.testing.assert_allclose(layer_weights("sink", metrics),
                               [1 - metrics[metrics.layer == layer].sink_mean.mean() for layer in range(3)])
    pre = qkv[qkv.stage == "projection"]
    np.testing.assert_allclose(layer_weights("key_rank", metrics, qkv),
                               [pre[pre.layer == layer].pca_rank90.mean() for layer in range(3)])
    np.testing.assert_allclose(head_weights("key_rank", metrics, qkv, 2),
                               pre.pivot(index="layer", columns="head", values="pca_rank90").to_numpy())
    per_head = head_weights("sink", metrics, None, 2)
    expected = 1 - metrics.pivot(index="layer", columns="head", values="sink_mean").to_numpy()
    np.testing.assert_allclose(per_head, expected.reshape(3, 2, 2).mean(-1))
    ratios = head_ratios(per_head, 0.5)
    np.testing.assert_allclose((1 - ratios).mean(), 0.5)
    with pytest.raises(ValueError, match="unknown measure"):
        layer_weights("rank", metrics)
    with pytest.raises(ValueError, match="qkv.csv"):
        layer_weights("key_rank", metrics)


def test_export_writes_kvpress_list(tmp_path) -> None:
    ratios = spectral([1.0, 2.0, 3.0])(0.5, 512)
    path = export(ratios, tmp_path / "ratios.json")
    assert json.loads(path.read_text()) == ratios
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        export([0.5, 1.0], tmp_path / "bad.json")
    with pytest.raises(ValueError, match="one ratio per layer"):
        export([[0.5, 0.4], [0.3, 0.2]], tmp_path / "per-head.json")


def test_a_scheduled_press_compresses_each_layer_at_its_ratio() -> None:
    prefill, _ = make_prefill(length=100)
    schedule = spectral([1.0, 3.0])
    press = Scheduled("knorm-test", REGISTRY["knorm"], schedule)
    ratios = schedule(0.5, 100)
    for layer in (0, 1):
        at_layer = dataclasses.replace(prefill, layer=layer)
        got = press.compress(at_layer, 0.5).kept
        assert got.shape[-1] == n_kept(100, ratios[layer])
        assert np.array_equal(got.numpy(), REGISTRY["knorm"].compress(at_layer, ratios[layer]).kept.numpy())
    flat = Scheduled("none", REGISTRY["knorm"], lambda ratio, length: [0.0, 0.0])
    assert flat.compress(prefill, 0.5).kept.shape[-1] == 100, "a layer scheduled at 0 keeps the full cache"
