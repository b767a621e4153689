"""The registry and what every registered method must satisfy: names, styles, padding, float32, substitution."""

from __future__ import annotations

import pytest
import torch

from layers import B, H, N, captured, random_layer, with_lengths
from spectra.capture import Captured
from spectra.config import Sharing
from spectra.errors import SpectraError
from spectra.methods import REGISTRY, Layer, expand, substitute
from spectra.probes.approx import measures

LENGTHS = (N, 7)
EXACT_AT_N = ["svd", "pool-mean", "pool-max", "nystrom", "probsparse"]
#: methods whose P̃ rows sum to one by construction (an approximate A⁺, nystrom-iter6, does not keep the mass at 1;
#: random E, F or R do not either)
ROW_STOCHASTIC = ["pool-mean", "performer", "nystrom", "skyformer", "probsparse"]


def test_names_expand_to_labels_in_registration_order() -> None:
    assert expand(["svd", "linformer"]) == ["svd"] + [f"linformer({s})" for s in Sharing]
    assert expand(["linformer(kv)", "svd", "linformer(kv)"]) == ["linformer(kv)", "svd"]
    assert expand(["nystrom"]) == ["nystrom"], "the iterative variant is a separate name"
    with pytest.raises(SpectraError, match="unknown method 'lsh'; valid methods: .*linformer.*pool-mean"):
        expand(["lsh"])
    with pytest.raises(SpectraError, match="unknown method 'fastformer'; valid methods: .*performer.*probsparse"):
        expand(["fastformer"])
    with pytest.raises(SpectraError, match="no method given"):
        expand([])


def test_every_method_has_its_own_style() -> None:
    styles = [(entry.color, entry.marker) for entry in REGISTRY.values()]
    assert len(set(styles)) == len(styles), "two methods would look alike in a figure"
    assert all(entry.short for entry in REGISTRY.values())


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_padded_sequence_measures_as_alone(name) -> None:
    padded = random_layer(LENGTHS, use_p=False)
    m = LENGTHS[1]
    alone = with_lengths(*(t[1:, :, :m] for t in (padded.q, padded.k, padded.v)), (m,))
    for budget in (1, 3, m):
        got, want = (measures(x, REGISTRY[name].run(x, budget))[:, -1] for x in (padded, alone))
        assert torch.allclose(got, want, atol=1e-9, equal_nan=True), (budget, got, want)
    assert torch.isfinite(REGISTRY[name].run(padded, 3).out).all(), "padded rows stay finite (they feed the next layer)"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_float32_is_finite_and_p_rows_sum_to_one(name) -> None:
    x = random_layer(LENGTHS, spread=1.5, use_p=False)
    x32 = Layer.of(Captured.of(3, x.q.float(), x.k.float(), x.v.float(), None, 0.7), use_p=False)
    approx = REGISTRY[name].run(x32, 5)
    assert approx.out.dtype == torch.float32 and torch.isfinite(approx.out).all()
    if approx.p is not None:
        assert torch.isfinite(approx.p).all()
    if name in ROW_STOCHASTIC:
        assert torch.allclose(approx.p.sum(-1), torch.ones(B, H, N), atol=1e-3)


@pytest.mark.parametrize("name", EXACT_AT_N)
def test_substitution_at_full_budget_is_exact_attention(name) -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, H, N, 4, generator=g, dtype=torch.float64) for _ in range(3))
    record = captured(q, k, v, LENGTHS, scaling=0.7)
    out = substitute(name, N, None)(record)
    exact = record.p @ record.v
    for b, m in enumerate(LENGTHS):
        assert torch.allclose(out[b, :, :m], exact[b, :, :m], atol=1e-9)
    assert substitute(name, N, [0])(record) is None, "layers outside the selection keep exact attention"


def test_layer_of_a_record_uses_its_p_or_recomputes_it() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, H, N, 4, generator=g) for _ in range(3))
    record = captured(q, k, v, LENGTHS, scaling=0.5)
    given, recomputed = Layer.of(record), Layer.of(record, use_p=False)
    assert given.q.dtype == torch.float32 and given._p is not None and recomputed._p is None
    assert torch.allclose(given.p, recomputed.p, atol=1e-6)
    assert (given.v[1, :, 7:] == 0).all() and (given.p[1, :, 7:] == 0).all() and (given.p[1, :, :, 7:] == 0).all()
