"""The Linformer's projections: sharing levels, seeds and initialisations, given weights, the slicing rule."""

from __future__ import annotations

import math

import pytest
import torch

from spectra.config import Init, Sharing
from spectra.errors import SpectraError
from spectra.nn.linformer import linear_attention
from spectra.nn.projections import (
    Projections,
    distinct_keys,
    jl_pair,
    jl_projection,
    projection_key,
)
from spectra.sources import gaussian_qkv

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sharing_counts_and_identity() -> None:
    counts = {s: Projections(12, 12, 4, 8, s).count for s in ("none", "headwise", "kv", "layerwise")}
    assert counts == {"none": 288, "headwise": 24, "kv": 12, "layerwise": 1}
    none, headwise = Projections(2, 3, 4, 8, "none"), Projections(2, 3, 4, 8, "headwise")
    kv, layerwise = Projections(2, 3, 4, 8, "kv"), Projections(2, 3, 4, 8, "layerwise")
    assert not torch.equal(none.matrix(0, 0, "e"), none.matrix(0, 1, "e"))
    assert not torch.equal(none.matrix(0, 0, "e"), none.matrix(0, 0, "f"))
    assert headwise.matrix(1, 0, "e") is headwise.matrix(1, 2, "e")
    assert headwise.matrix(1, 0, "e") is not headwise.matrix(1, 0, "f")
    assert headwise.matrix(0, 0, "e") is not headwise.matrix(1, 0, "e")
    assert kv.matrix(1, 0, "e") is kv.matrix(1, 2, "f")
    assert kv.matrix(0, 0, "e") is not kv.matrix(1, 0, "e")
    assert layerwise.matrix(0, 0, "e") is layerwise.matrix(1, 2, "f")
    assert sum(p.numel() for p in layerwise.parameters()) == 4 * 8


def test_projection_keys_and_the_enum_or_its_string() -> None:
    assert projection_key("none", 1, 2, "f") == (1, 2, "f")
    assert projection_key(Sharing.HEADWISE, 1, 2, "f") == (1, -1, "f")
    assert projection_key("kv", 1, 2, "e") == projection_key("kv", 1, 0, "f") == (1, -1, "ef")
    assert projection_key("layerwise", 1, 2, "e") == (-1, -1, "ef")
    assert distinct_keys("headwise", 2, 3) == [(0, -1, "e"), (0, -1, "f"), (1, -1, "e"), (1, -1, "f")]
    assert distinct_keys(Sharing.KV, 2, 3) == [(0, -1, "ef"), (1, -1, "ef")]
    for sharing in Sharing:
        enum, text = Projections(2, 3, 4, 8, sharing, seed=1), Projections(2, 3, 4, 8, sharing.value, seed=1)
        assert enum.keys == text.keys == distinct_keys(sharing, 2, 3)
        assert all(torch.equal(a, b) for a, b in zip(enum.parameters(), text.parameters()))
    assert torch.equal(Projections(1, 1, 4, 8, init=Init.XAVIER).matrix(0, 0, "e"),
                       Projections(1, 1, 4, 8, init="xavier").matrix(0, 0, "e"))


def test_initialisations_seeds_and_delta() -> None:
    a, b = Projections(2, 2, 64, 128, "none", seed=5), Projections(2, 2, 64, 128, "none", seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    other = Projections(2, 2, 64, 128, "none", seed=6)
    assert not torch.equal(a.matrix(0, 0, "e"), other.matrix(0, 0, "e"))
    assert abs(a.matrix(0, 0, "e").std().item() - 1 / 8) < 0.01  # N(0, 1/budget)
    e, f = jl_pair("none", 1, 2, 64, 128, seed=5)
    assert torch.equal(e, a.pair(1)[0]) and torch.equal(f, a.pair(1)[1])
    assert torch.equal(a.matrix(1, 1, "f"), jl_projection((1, 1, "f"), 64, 128, seed=5))
    xavier = Projections(1, 1, 64, 128, "layerwise", init="xavier").matrix(0, 0, "e")
    bound = math.sqrt(3 / (128 + 64))  # xavier_uniform_ with gain 1/√2 on nn.Linear(128, 64)
    assert xavier.abs().max() <= bound and xavier.abs().max() > 0.95 * bound
    assert abs(xavier.std().item() - bound / math.sqrt(3)) < 0.01
    scaled = Projections(1, 2, 4, 8, "kv", delta=0.25)
    e, f = scaled.pair(0)
    r = scaled.matrix(0, 0, "e")
    assert torch.allclose(e[1], 0.25 * r) and torch.allclose(f[1], math.exp(-0.25) * r)


@pytest.mark.parametrize("sharing", ["none", "headwise", "kv", "layerwise"])
def test_jl_pair_draws_one_layer_as_projections_does(sharing) -> None:
    projections = Projections(3, 2, 4, 16, sharing, seed=7)
    for layer in range(3):
        e, f = jl_pair(sharing, layer, 2, 4, 16, seed=7)
        want_e, want_f = projections.pair(layer)
        assert torch.equal(e, want_e) and torch.equal(f, want_f)


def test_given_weights() -> None:
    weights = torch.randn(4, 3, 10)
    projections = Projections(2, 5, 3, 10, "headwise", weights=weights)
    assert torch.equal(projections.matrix(1, 3, "f"), weights[3])  # keys: (0,e), (0,f), (1,e), (1,f)
    single = torch.randn(3, 10)
    assert torch.equal(Projections(2, 5, 3, 10, "layerwise", weights=single).matrix(1, 4, "e"), single)
    keyed = {(0, -1, "ef"): single, (1, -1, "ef"): 2 * single}
    assert torch.equal(Projections(2, 5, 3, 10, "kv", weights=keyed).matrix(1, 0, "f"), 2 * single)
    with pytest.raises(SpectraError, match="do not fit sharing"):
        Projections(2, 5, 3, 10, "headwise", weights=torch.randn(3, 3, 10))
    with pytest.raises(SpectraError, match="expected \\(budget, max_len\\)"):
        Projections(1, 1, 3, 10, "layerwise", weights=torch.randn(3, 9))
    with pytest.raises(SpectraError, match="weights lack the projections"):
        Projections(2, 5, 3, 10, "kv", weights={(0, -1, "ef"): single})


def test_given_weights_keep_their_dtype() -> None:
    weights = torch.randn(4, 3, 10, dtype=torch.float64) / 3
    projections = Projections(2, 5, 3, 10, "headwise", weights=weights)
    assert projections.matrix(1, 3, "f").dtype == torch.float64
    assert torch.equal(projections.matrix(1, 3, "f"), weights[3]), "no rounding through float32"
    e, f = projections.pair(1)
    assert e.dtype == f.dtype == torch.float64 and torch.equal(f[0], weights[3])
    keyed = {(0, -1, "ef"): weights[0], (1, -1, "ef"): weights[1].float()}
    assert Projections(2, 5, 3, 10, "kv", weights=keyed).matrix(1, 0, "e").dtype == torch.float64, "common dtype"
    assert Projections(1, 1, 3, 10, "layerwise", weights=torch.ones(3, 10, dtype=torch.int64)).matrix(
        0, 0, "e").dtype == torch.float32
    half = Projections(1, 1, 3, 10, "layerwise", weights=torch.randn(3, 10, dtype=torch.float16))
    assert half.matrix(0, 0, "e").dtype == torch.float16
    for init in ("jl", "xavier"):
        assert Projections(1, 1, 3, 10, init=init).matrix(0, 0, "e").dtype == torch.float32


def test_slicing_rule_uses_the_first_columns() -> None:
    projections = Projections(1, 2, 4, 32, "none", seed=2)
    q, k, v = gaussian_qkv(20, 8, heads=2, seed=1)
    e, f = projections.pair(0, 20)
    assert e.shape == (2, 4, 20)
    assert torch.equal(e[1], projections.matrix(0, 1, "e")[:, :20])
    full_e, full_f = projections.pair(0)
    assert torch.allclose(linear_attention(q, k, v, full_e, full_f), linear_attention(q, k, v, e, f))
    with pytest.raises(SpectraError, match="max_len"):
        projections.pair(0, 33)


@pytest.mark.parametrize("make, message", [
    (lambda: Projections(1, 1, 0, 8), "positive integer"),
    (lambda: Projections(1, 1, 9, 8), "exceeds max_len"),
    (lambda: Projections(1, 1, 4, 8, "rowwise"), "unknown sharing"),
    (lambda: Projections(1, 1, 4, 8, init="zeros"), "unknown init"),
    (lambda: Projections(0, 1, 4, 8), "layers and heads must be ≥ 1"),
    (lambda: Projections(1, 1, 4, 8, delta=-0.5), "delta must be ≥ 0"),
    (lambda: Projections(1, 2, 4, 8).matrix(0, 2, "e"), "no projection"),
    (lambda: jl_pair("kv", 0, 1, 0, 8), "positive integer"),
])
def test_bad_input_is_one_line(make, message) -> None:
    with pytest.raises(SpectraError, match=message) as error:
        make()
    assert "\n" not in str(error.value)
