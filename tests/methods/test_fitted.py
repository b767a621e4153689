"""The fitted Linformer methods are eq. 7 with the projections their instance holds: dense check with given (not
pooled) matrices, per sharing level; a missing fit says how to get one; fit and save → load round trip; refusal of
causal calibrations is the method's (it says it is not causal)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibrations import synthetic
from layers import H, N, draws, random_layer, softmax
from spectra.reporter import Reporter
from spectra.config import Sharing
from spectra.errors import SpectraError
from spectra.methods import REGISTRY, Layer
from spectra.methods.fitted import LinformerFit, LinformerPCA
from spectra.nn.descent import FitSettings
from spectra.nn.fit import fit_projections, pca_projections
from spectra.nn.projections import Projections

FAMILIES = {"linformer-pca": LinformerPCA, "linformer-fit": LinformerFit}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sharing", list(Sharing))
def test_fitted_method_is_eq7_with_the_given_projections(family, sharing) -> None:
    label, budget = f"{family}({sharing})", 4
    method = REGISTRY[label].fresh()
    assert isinstance(method, FAMILIES[family]) and method.sharing == sharing and method.calibrates
    given = Projections(5, H, budget, N, sharing, seed=11, trainable=False)  # any fixed matrices stand in for a fit
    method.projections = {budget: given}
    x = random_layer(lengths=(N, 7))
    approx = method(x, budget, draws(x))
    e, f = given.pair(x.layer, N)
    for b, m in enumerate((N, 7)):
        for h in range(H):
            ek = e[h, :, :m].double().numpy() @ x.k[b, h, :m].numpy()
            fv = f[h, :, :m].double().numpy() @ x.v[b, h, :m].numpy()
            want = softmax(x.q[b, h, :m].numpy() @ ek.T * 0.7) @ fv
            assert np.allclose(approx.out[b, h, :m].numpy(), want, atol=1e-6), (b, h)


def test_a_fitted_method_without_its_fit_names_the_option() -> None:
    x = random_layer()
    with pytest.raises(SpectraError, match="pass fit_samples=N to spectra.approx") as raised:
        REGISTRY["linformer-fit(kv)"](x, 3, draws(x))
    assert raised.value.for_cli().endswith("pass --fit-samples N to spectra approx")
    fitted = REGISTRY["linformer-fit(kv)"].fresh()
    fitted.projections = {4: Projections(5, H, 4, N, "kv", trainable=False)}
    with pytest.raises(SpectraError, match="at k = 3 needs"):
        fitted(x, 3, draws(x))


@pytest.mark.parametrize("label", ["linformer-pca(headwise)", "linformer-fit(kv)"])
def test_fit_is_the_nn_fit_at_every_budget_and_arrays_round_trip(label) -> None:
    """`fit` stores, per budget, exactly what `nn.fit` computes with the settings; its arrays load into a fresh
    instance that approximates bit for bit the same."""
    calibs = [synthetic(layer) for layer in range(2)]
    settings = FitSettings(budgets=(3, 5), steps=4, lr=0.05, seed=2)
    method = REGISTRY[label].fresh()
    lines: list[str] = []
    history = method.fit(calibs, layers=2, heads=2, n=10, settings=settings, reporter=Reporter(None, lines.append))
    for budget in (3, 5):
        shape = (calibs, 2, 2, budget, 10, method.sharing)
        want = (pca_projections(*shape) if method.family == "linformer-pca" else
                fit_projections(*shape, steps=4, lr=0.05, seed=2).projections)
        for key in want.keys:
            assert torch.equal(method.projections[budget].matrix(max(key[0], 0), max(key[1], 0), key[2][0]),
                               want.matrix(max(key[0], 0), max(key[1], 0), key[2][0]))
    if method.family == "linformer-fit":
        assert sorted(set(history["budget"])) == [3, 5] and len(history) == 2 * 2 * 5
        kept = [line.split(":")[0] for line in lines if line.startswith("fitted")]
        assert kept == [f"fitted {label} at k = 3", f"fitted {label} at k = 5"], lines
    else:
        assert history.empty and not lines
    loaded = REGISTRY[label].fresh()
    loaded.load_arrays({**method.arrays(), "fastformer-fit|layers": np.array([0])})  # others' arrays are left alone
    other = synthetic(1, seed=5)  # another layer 1 of 2 heads
    x = Layer(1, other.q, other.k, other.v * other.valid[:, None, :, None], other.valid, other.scaling)
    for budget in (3, 5):
        assert torch.equal(loaded(x, budget, draws(x)).out, method(x, budget, draws(x)).out)
    assert not REGISTRY[label].fitted, "the registry's instance is never fitted"


def test_a_linformer_is_not_causal() -> None:
    """Eq. 7 mixes every key into each projected key: every Linformer method says it is not causal, so a run refuses
    to calibrate it on a decoder (`probes.fitting`)."""
    assert not any(m.causal for m in REGISTRY.values() if m.family in FAMILIES)
