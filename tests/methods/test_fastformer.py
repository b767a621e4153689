"""Fastformer's additive attention, fitted: the output against the paper's formulas written out in numpy one
position at a time (bidirectional, and causal over each prefix, padded on either side, with logits large enough
to overflow a naive exponential), its gradients, the start of the fit (the least-squares output transform of
uniform pooling, checked against numpy's least squares), the fit per head (kept steps, never worse than the
start), the fitted parameters round trip, and what the method declares."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from calibrations import synthetic
from layers import draws
from methods.causal_layers import layer as causal_layer
from references import additive_attention_reference as reference

from spectra.errors import SpectraError
from spectra.methods import REGISTRY, Layer, fastformer
from spectra.methods.fastformer import (
    Fastformer,
    additive_attention,
    head_errors,
    output_transform,
)
from spectra.nn.calibration import Calibration
from spectra.nn.descent import FitSettings, validation_split
from spectra.reporter import QUIET, Reporter

pytestmark = pytest.mark.usefixtures("one_thread")

H, D = 2, 3


def weights(heads: int = H, d: int = D, *, seed: int = 0, spread: float = 1.0) -> tuple[torch.Tensor, ...]:
    """Random w_q, w_k (H, d), W_r (H, d, d), b_r (H, d)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64) * scale
                 for shape, scale in (((heads, d), spread), ((heads, d), spread), ((heads, d, d), 1.0), ((heads, d), 1.0)))


def check_against_reference(x: Layer, causal: bool, parameters: tuple[torch.Tensor, ...], atol: float) -> None:
    out = additive_attention(x.q, x.k, x.v, x.valid, causal, *parameters)
    for b in range(x.q.shape[0]):
        valid = x.valid[b].numpy()
        for h in range(x.q.shape[1]):
            want = reference(*(t[b, h].numpy() for t in (x.q, x.k, x.v)), valid, causal,
                             *(p[h].numpy() for p in parameters))
            assert np.allclose(out[b, h][valid].numpy(), want[valid], atol=atol, rtol=1e-9), (b, h)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 4, 64])
def test_additive_attention_is_the_papers_formula(side, causal, block, monkeypatch) -> None:
    """Blocks of 1, 4 (n = 12: carried across blocks) or 64 positions (one block) give the formula's numbers."""
    monkeypatch.setattr(fastformer, "CAUSAL_BLOCK", block)
    x = causal_layer((12, 7), side, causal=causal, n=12, spread=1.5)
    check_against_reference(x, causal, weights(3, 4, seed=1), atol=1e-10)


def test_the_prefix_sums_hold_logits_that_overflow_a_plain_exponential(monkeypatch) -> None:
    """w_q, w_k of size 400 make logits of hundreds, growing along the sequence: e^a overflows float64, the
    running maximum keeps every exponent ≤ 0."""
    monkeypatch.setattr(fastformer, "CAUSAL_BLOCK", 4)
    x = causal_layer((12, 7), "left", causal=True, n=12, spread=2.0)
    parameters = weights(3, 4, seed=2, spread=400.0)
    logits = torch.einsum("bhnd,hd->bhn", x.q, parameters[0]) * 4 ** -0.5
    assert logits.abs().max() > 800, "the test needs logits a plain exponential overflows at"
    check_against_reference(x, True, parameters, atol=1e-8)
    assert torch.isfinite(additive_attention(x.q.float(), x.k.float(), x.v.float(), x.valid, True,
                                             *(p.float() for p in parameters))).all()


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_are_those_of_the_formula(causal, monkeypatch) -> None:
    """Finite differences of the output in w_q, w_k, W_r, b_r (the running maximum of the prefix sums is held
    constant in the backward pass: it cancels, so the gradient is still the formula's)."""
    monkeypatch.setattr(fastformer, "CAUSAL_BLOCK", 3)
    x = causal_layer((8, 5), "right", causal=causal, n=8)
    parameters = tuple(p.clone().requires_grad_() for p in weights(3, 4, seed=3, spread=2.0))
    assert torch.autograd.gradcheck(lambda *p: additive_attention(x.q, x.k, x.v, x.valid, causal, *p), parameters)


def test_the_causal_variant_never_looks_ahead_and_is_fastformer_on_a_bidirectional_layer() -> None:
    method = REGISTRY["fastformer-fit-causal"].fresh()
    parameters = weights(3, 4, seed=4)
    method.parameters = {3: parameters}
    both = REGISTRY["fastformer-fit"].fresh()
    both.parameters = {3: parameters}
    x = causal_layer((12, 7), "right", causal=False)
    assert torch.equal(method(x, 5, draws(x)).out, both(x, 5, draws(x)).out)
    decoder = causal_layer((12, 7), "left", causal=True)
    out = method(decoder, 5, draws(decoder)).out
    assert torch.equal(out, additive_attention(decoder.q, decoder.k, decoder.v, decoder.valid, True, *parameters))
    assert not torch.allclose(out, both(decoder, 5, draws(decoder)).out), "fastformer-fit on a decoder looks ahead"


def test_every_budget_is_the_same_fit() -> None:
    method = REGISTRY["fastformer-fit"].fresh()
    method.parameters = {3: weights(3, 4, seed=5)}
    x = causal_layer((12, 7), causal=False)
    assert method(x, 1, draws(x)).p is None
    assert torch.equal(method(x, 1, draws(x)).out, method(x, 12, draws(x)).out)


def weighted_least_squares(calib: Calibration, rows: torch.Tensor, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """W_r (H, d, d), b_r (H, d) by numpy: each head's valid rows of the sequences `rows`, the uniform pooling's
    u = mean-pooled k_g ⊙ v_i (the reference at w = 0) and 1 as regressors, each sequence weighted 1/‖PV‖."""
    d = calib.q.shape[-1]
    zero, eye = np.zeros(d), np.eye(d)
    found_w, found_b = [], []
    for h in range(calib.heads):
        design, target = [], []
        for s in rows.tolist():
            valid = calib.valid[s].numpy()
            q, k, v = (t[s, h].numpy() * (valid[:, None] if t is calib.v else 1) for t in (calib.q, calib.k, calib.v))
            u = reference(q, k, v, valid, causal, zero, zero, eye, zero)
            goal = calib.target[s, h].numpy()
            weight = 1 / np.linalg.norm(goal)
            design.append(np.hstack([u, np.ones((len(u), 1))])[valid] * weight)
            target.append(goal[valid] * weight)
        solution = np.linalg.lstsq(np.vstack(design), np.vstack(target), rcond=None)[0]  # (d + 1, d)
        found_w.append(solution[:d].T)
        found_b.append(solution[d])
    return np.stack(found_w), np.stack(found_b)


def causal_calibration(layer: int = 0, seed: int = 0) -> Calibration:
    calib = synthetic(layer, seed=seed)
    return Calibration(calib.layer, calib.q, calib.k, calib.v, calib.valid, calib.scaling, causal=True)


@pytest.mark.parametrize("causal", [False, True])
def test_the_start_is_the_least_squares_output_transform_of_uniform_pooling(causal) -> None:
    calib = causal_calibration() if causal else synthetic()
    rows = torch.tensor([0, 2, 3, 5])
    w_r, b_r = output_transform(calib, rows, causal)
    want_w, want_b = weighted_least_squares(calib, rows, causal)
    assert np.allclose(w_r.numpy(), want_w, atol=1e-9) and np.allclose(b_r.numpy(), want_b, atol=1e-9)


@pytest.mark.parametrize("label", ["fastformer-fit", "fastformer-fit-causal"])
def test_the_fit_keeps_each_heads_best_step_never_worse_than_its_start(label) -> None:
    """Per layer and head: step 0 is uniform pooling with the least-squares transform; the kept step has the lowest
    held-out error among the steps not worse than step 0 on the calibration rows; the fitted parameters give the
    recorded errors (recomputed here from the numpy formula)."""
    causal = label.endswith("causal")
    calibs = [causal_calibration(layer) if causal else synthetic(layer) for layer in range(2)]
    settings = FitSettings(budgets=(3, 5), steps=25, lr=0.05, validation=0.34, seed=1)
    method = REGISTRY[label].fresh()
    lines: list[str] = []
    history = method.fit(calibs, layers=2, heads=2, n=10, settings=settings, reporter=Reporter(None, lines.append))
    assert list(history.columns) == ["budget", "layer", "head", "step", "calibration", "validation"]
    assert set(history["budget"]) == {-1} and len(history) == 2 * 2 * 26, "one fit for every budget"
    assert lines[-1].startswith(f"fitted {label}: kept steps") and method.fitted
    assert not REGISTRY[label].fitted, "the registry's instance is never fitted"
    moved = []
    for calib in calibs:
        train, held = validation_split(calib.sequences, 0.34, 1)
        w_r, b_r = output_transform(calib, train, causal)
        parameters = method.parameters[calib.layer]
        for h in range(2):
            rows = history[(history["layer"] == calib.layer) & (history["head"] == h)].set_index("step")
            allowed = rows[rows["calibration"] <= rows.loc[0, "calibration"]]
            kept = allowed["validation"].idxmin()
            assert rows.loc[kept, "calibration"] <= rows.loc[0, "calibration"]
            moved.append(kept > 0)
            for index, column in ((train, "calibration"), (held, "validation")):
                errors = []
                for s in index.tolist():
                    valid = calib.valid[s].numpy()
                    q, k, v = (t[s, h].numpy() for t in (calib.q, calib.k, calib.v))
                    out = reference(q, k, v * valid[:, None], valid, causal, *(p[h].numpy() for p in parameters))
                    goal = calib.target[s, h].numpy()
                    errors.append(((out - goal)[valid] ** 2).sum() / (goal ** 2).sum())
                assert np.mean(errors) == pytest.approx(rows.loc[kept, column], rel=1e-9), (calib.layer, h, column)
            start = [calib.q.new_zeros(D), calib.q.new_zeros(D), w_r[h], b_r[h]]
            units = [start if head == h else [p[head] for p in parameters] for head in range(2)]
            assert head_errors(calib, train, causal, units, False)[h] == pytest.approx(rows.loc[0, "calibration"],
                                                                                       rel=1e-12)
    assert any(moved), "descent improved on the start somewhere (else the kept parameters are only the start's)"


def test_fitted_parameters_round_trip_and_an_unfitted_method_says_how_to_fit_it() -> None:
    x = causal_layer((12, 7), causal=False)
    with pytest.raises(SpectraError, match="fastformer-fit needs .* pass fit_samples=N to spectra.approx"):
        REGISTRY["fastformer-fit"](x, 3, draws(x))
    method = REGISTRY["fastformer-fit"].fresh()
    method.parameters = {3: weights(3, 4, seed=6), 5: weights(3, 4, seed=7)}
    arrays = method.arrays()
    assert set(arrays) == {f"fastformer-fit|{name}" for name in ("layers", "w_q", "w_k", "w_r", "b_r")}
    loaded = REGISTRY["fastformer-fit"].fresh()
    loaded.load_arrays({**arrays, "linformer-fit(kv)|4|shape": np.array([1, 2, 4, 8])})  # others' are left alone
    assert sorted(loaded.parameters) == [3, 5]
    assert torch.equal(loaded(x, 3, draws(x)).out, method(x, 3, draws(x)).out)
    other = REGISTRY["fastformer-fit-causal"].fresh()
    other.load_arrays(arrays)
    assert not other.fitted, "one variant's parameters are not another's"


def test_fastformer_declares_what_it_is() -> None:
    for label, causal in (("fastformer-fit", False), ("fastformer-fit-causal", True)):
        method = REGISTRY[label]
        assert isinstance(method, Fastformer) and method.calibrates and not method.random
        assert method.causal == causal and method.family == label


def test_a_fit_on_gaussian_data_moves_the_pooling_vectors() -> None:
    """The vectors do learn: on sequences whose exact attention favours a direction of q and k, w_q and w_k leave
    zero and the held-out error falls below that of uniform pooling."""
    g = torch.Generator().manual_seed(9)
    n, sequences = 10, 12
    direction = torch.randn(D, generator=g, dtype=torch.float64)
    q, k, v = (torch.randn(sequences, 1, n, D, generator=g, dtype=torch.float64) for _ in range(3))
    k = k + 2 * direction  # every query prefers keys along the direction: attention is far from uniform
    calib = Calibration(0, q, k, v, torch.ones(sequences, n, dtype=torch.bool), 1.5)
    method = REGISTRY["fastformer-fit"].fresh()
    history = method.fit([calib], layers=1, heads=1, n=n, settings=FitSettings(steps=60, lr=0.1, seed=0),
                         reporter=QUIET).set_index("step")
    w_q, w_k = method.parameters[0][:2]
    assert w_q.abs().max() > 0 or w_k.abs().max() > 0
    assert history["validation"].min() < 0.95 * history.loc[0, "validation"]
