"""The registry and what every registered method must satisfy: names, styles, padding, float32, substitution."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from layers import B, H, N, approximate, captured, draws, method, random_layer, stand_in_fits, with_lengths
from methods.causal_layers import layer as causal_layer, look_ahead, model_mask, valid_positions
from spectra.capture import Captured
from spectra.config import Sharing
from spectra.errors import InternalError, SpectraError
from spectra.methods import REGISTRY, Approximation, Draws, Layer, Method, substitute
from spectra.probes.approx import measures

LENGTHS = (N, 7)
EXACT_AT_N = ["svd", "svd-causal", "pool-mean", "pool-max", "nystrom", "probsparse", "window", "topk"]
#: methods whose P̃ rows sum to one by construction (an approximate A⁺, nystrom-iter6, does not keep the mass at 1;
#: random E, F or R do not either)
ROW_STOCHASTIC = ["pool-mean", "performer", "performer-causal", "nystrom", "skyformer", "probsparse", "window", "topk"]
#: the methods registered when this test was written (a method added since is checked by its own test)
KNOWN = ["svd", "svd-causal", "jl", *(f"linformer({s})" for s in Sharing), "pool-mean", "pool-max", "performer",
         "performer-causal", "nystrom", "nystrom-iter6", "skyformer", "probsparse", "window", "topk",
         *(f"{family}({s})" for family in ("linformer-pca", "linformer-fit") for s in Sharing), "fastformer-fit",
         "fastformer-fit-causal"]
#: methods registered as causal: a query's output never depends on a later position
CAUSAL = [label for label, entry in REGISTRY.items() if entry.causal]
SIDES = ["left", "right"]


def test_every_method_has_its_own_style() -> None:
    styles = [(entry.color, entry.marker) for entry in REGISTRY.values()]
    assert len(set(styles)) == len(styles), "two methods would look alike in a figure"
    assert all(entry.short for entry in REGISTRY.values())


def test_every_method_is_an_object_that_says_what_it_is() -> None:
    """Each registered method is a `Method` whose variants share one class; what it is is declared, not guessed
    from its name."""
    assert all(isinstance(m, Method) and m.label == label for label, m in REGISTRY.items())
    calibrating = {*(f"{family}({s})" for family in ("linformer-pca", "linformer-fit") for s in Sharing),
                   "fastformer-fit", "fastformer-fit-causal"}
    causal = {"svd-causal", "performer-causal", "window", "topk", "fastformer-fit-causal"}
    for label in KNOWN:  # the methods of this test's time; one added since says what it is in its own test
        method = REGISTRY[label]
        assert (method.random, method.calibrates, method.causal) == (
            label in RANDOM, label in calibrating, label in causal), label
    assert len({type(REGISTRY[f"linformer({s})"]) for s in Sharing}) == 1
    assert type(REGISTRY["nystrom"]) is type(REGISTRY["nystrom-iter6"])


def test_a_calibrating_method_is_fitted_on_a_fresh_instance() -> None:
    """A run fits its own copy: the registry's instance stays unfitted, and two copies never share parameters."""
    prototype = REGISTRY["linformer-fit(kv)"]
    one, two = prototype.fresh(), prototype.fresh()
    assert not prototype.fitted and not one.fitted and one is not two and one.label == prototype.label
    fitted = stand_in_fits()["linformer-fit(kv)"]
    assert fitted.fitted and not prototype.fitted and fitted.projections is not one.projections
    with pytest.raises(SpectraError, match="linformer-fit\\(kv\\) at k = 3 needs .*pass fit_samples=N"):
        prototype(random_layer(), 3, draws(random_layer()))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_padded_sequence_measures_as_alone(name) -> None:
    padded = random_layer(LENGTHS, use_p=False)
    m = LENGTHS[1]
    alone = with_lengths(*(t[1:, :, :m] for t in (padded.q, padded.k, padded.v)), (m,))
    for budget in (1, 3, m):
        got, want = (measures(x, approximate(name, x, budget))[:, -1] for x in (padded, alone))
        assert torch.allclose(got, want, atol=1e-9, equal_nan=True), (budget, got, want)
    assert torch.isfinite(approximate(name, padded, 3).out).all(), "padded rows stay finite (they feed the next layer)"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_float32_is_finite_and_p_rows_sum_to_one(name) -> None:
    x = random_layer(LENGTHS, spread=1.5, use_p=False)
    x32 = Layer.of(Captured.of(3, x.q.float(), x.k.float(), x.v.float(), None, 0.7), use_p=False)
    approx = approximate(name, x32, 5)
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
    out = substitute(method(name), N, None)(record)
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


# ---------------------------------------------------------------- causal methods


def test_the_decoder_methods_are_registered_causal() -> None:
    assert {"window", "topk", "performer-causal", "svd-causal", "fastformer-fit-causal"} <= set(CAUSAL)
    assert all(REGISTRY[label].family == label for label in CAUSAL)
    assert all(len(REGISTRY[label].short.splitlines()) == 2 for label in CAUSAL)


def naive_masked_svd(x: Layer, budget: int, draws: Draws) -> Approximation:
    """The rank-k truncated SVD of the whole causal P with the causal mask re-applied: NOT causal."""
    u, sigma, vh = x.svd()
    p_k = ((u[..., :budget] * sigma[..., None, :budget]) @ vh[..., :budget, :]) * x.allowed
    return Approximation(p_k @ x.v, p_k)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CAUSAL)
def test_causal_methods_never_look_ahead(name, side) -> None:
    """Redrawing q, k, v after position i leaves every output row ≤ i and P̃'s rows ≤ i as they were."""
    x = causal_layer(side=side, spread=1.5)
    for budget in (1, 3, 6):
        for i in (2, 6, 9):
            assert look_ahead(method(name), x, budget, i) < 1e-12, (budget, i)


@pytest.mark.parametrize("side", SIDES)
def test_the_look_ahead_check_catches_the_naive_masked_svd(side) -> None:
    """The check can fail: the SVD basis of the whole P comes from every row, so later queries and keys change
    an earlier row's approximation even with the causal mask re-applied."""
    x = causal_layer(side=side, spread=1.5)
    for budget in (3, 6):
        for i in (6, 9):
            assert look_ahead(naive_masked_svd, x, budget, i) > 1e-3, (budget, i)
            assert look_ahead(REGISTRY["svd-causal"], x, budget, i) < 1e-12


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CAUSAL)
def test_causal_padded_sequence_measures_as_alone(name, side) -> None:
    padded = causal_layer(LENGTHS, side=side)
    m = LENGTHS[1]
    kept = slice(N - m, N) if side == "left" else slice(0, m)
    alone = causal_layer((m,), n=m)
    alone = replace(alone, q=padded.q[1:, :, kept], k=padded.k[1:, :, kept], v=padded.v[1:, :, kept], _p=None)
    for budget in (1, 3, m):
        got, want = (measures(x, approximate(name, x, budget))[:, -1] for x in (padded, alone))
        assert torch.allclose(got, want, atol=1e-9, equal_nan=True), (budget, got, want)
    assert torch.isfinite(approximate(name, padded, 3).out).all(), "padded rows stay finite (they feed the next layer)"


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CAUSAL)
def test_causal_float32_is_finite_and_p_rows_sum_to_one(name, side) -> None:
    x32 = causal_layer(LENGTHS, side=side, spread=1.5, dtype=torch.float32)
    approx = approximate(name, x32, 5)
    assert approx.out.dtype == torch.float32 and torch.isfinite(approx.out).all()
    if approx.p is not None:
        assert torch.isfinite(approx.p).all()
    if name in ROW_STOCHASTIC:
        sums = approx.p.sum(-1)[x32.valid[:, None, :].expand(-1, H, -1)]
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-3)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", sorted(set(EXACT_AT_N) & set(CAUSAL)))
def test_causal_substitution_at_full_budget_is_exact_attention(name, side) -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, H, N, 4, generator=g, dtype=torch.float64) for _ in range(3))
    valid = valid_positions(LENGTHS, N, side)
    record = Captured.of(3, q, k, v, model_mask(valid, True, torch.float64), 0.7, causal=True, index=(0, 1))
    out = substitute(name, N, None)(record)
    exact = record.p @ record.v  # eager attention with the model's causal mask
    rows = valid[:, None, :, None]
    assert torch.allclose(out * rows, exact * rows, atol=1e-9)


# ---------------------------------------------------------------- randomness drawn per sequence

#: the methods made of random draws (projections, features, landmark or key samples): each sequence draws its own,
#: seeded by its global index, unless the draws are fixed
RANDOM = ["jl", *(f"linformer({s})" for s in Sharing), "performer", "performer-causal", "skyformer", "probsparse"]


def twins() -> Layer:
    """One sequence twice."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, H, N, 4, generator=g, dtype=torch.float64).expand(2, -1, -1, -1) for _ in range(3))
    return with_lengths(q, k, v, (N, N))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_random_methods_draw_per_sequence_unless_fixed(name) -> None:
    """Two copies of one sequence, as sequences 5 and 2 of a run, get different approximations exactly when the
    method is random and the draws are not fixed."""
    x = twins()
    for fixed in (False, True):
        out = approximate(name, x, 5, draws(x, fixed=fixed, index=(5, 2))).out
        assert torch.allclose(out[0], out[1], atol=1e-12) == (fixed or name not in RANDOM), (name, fixed)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_per_sequence_draws_do_not_depend_on_the_batch(name) -> None:
    """A sequence drawing its own randomness gets the same result alone, padded in a batch, or at another position
    of another batch: its draws are seeded by its global index, never by its place in the batch."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(3, H, N, 4, generator=g, dtype=torch.float64) for _ in range(3))
    batch = with_lengths(q, k, v, (N, 7, N))
    swapped = with_lengths(q[[2, 0]], k[[2, 0]], v[[2, 0]], (N, N))
    alone = [(with_lengths(q[b:b + 1, :, :m], k[b:b + 1, :, :m], v[b:b + 1, :, :m], (m,)), i)
             for b, (m, i) in enumerate(((N, 5), (7, 2), (N, 8)))]
    for budget in (3, 7):
        run = method(name)
        got = measures(batch, run(batch, budget, draws(batch, fixed=False, index=(5, 2, 8))))
        other = measures(swapped, run(swapped, budget, draws(swapped, fixed=False, index=(8, 5))))
        for b, (x, i) in enumerate(alone):
            want = measures(x, run(x, budget, draws(x, fixed=False, index=(i,))))[:, 0]
            assert torch.allclose(got[:, b], want, atol=1e-9, equal_nan=True), (budget, b)
        assert torch.allclose(other[:, 0], got[:, 2], atol=1e-9, equal_nan=True)
        assert torch.allclose(other[:, 1], got[:, 0], atol=1e-9, equal_nan=True)


def test_per_sequence_draws_need_the_sequence_indices() -> None:
    """Draws without the sequences' indices are a bug that raises, never a fall back to batch positions — for every
    method, fixed draws included (a run's records always carry them)."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, H, N, 4, generator=g) for _ in range(3))
    anonymous = Captured.of(3, q, k, v)  # made outside a run: no indices
    with pytest.raises(InternalError, match="no sequence indices"):
        Draws.of(anonymous)
    with pytest.raises(InternalError, match="need the sequences' global indices"):
        Draws(0, None)
    x = Layer.of(anonymous)
    with pytest.raises(InternalError, match="1 sequence indices for a batch of 2"):
        REGISTRY["jl"](x, 4, Draws(0, (4,)))
    with pytest.raises(InternalError, match="no sequence indices"):
        substitute("svd", 4, None, fixed=True)(anonymous)
    record = Captured.of(3, q, k, v, index=(4, 9))
    assert Draws.of(record).index == (4, 9) and substitute("jl", 4, None)(record).shape == q.shape
