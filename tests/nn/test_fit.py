"""Fitted and data-driven Linformer projections: the objective against its formula and finite differences, PCA
against a dense numpy eigendecomposition, the fit's guarantees (pooling init, kept step, determinism, padding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

import tiny
from spectra import capture
from spectra.errors import SpectraError
from spectra.methods import REGISTRY, Layer
from spectra.methods.pooling import mean_pooling_matrix, windows
from spectra.nn.fit import (Calibration, fit_projections, head_output_error, pca_projections, pooling_matrix,
                            pooling_projections, principal_rows, validation_split)
from spectra.nn.linformer import linear_attention
from spectra.nn.projections import Projections

pytestmark = pytest.mark.usefixtures("one_thread")

SHARINGS = ("none", "headwise", "kv", "layerwise")


def synthetic(layer: int = 0, lengths=(10, 10, 7, 10, 4, 10), n: int = 10, heads: int = 2, d: int = 3,
              dtype=torch.float64, seed: int = 0) -> Calibration:
    """Gaussian q, k, v with a shared key component and a positional trend, padded after `lengths`."""
    g = torch.Generator().manual_seed(seed + 17 * layer)
    shape = (len(lengths), heads, n, d)
    position = torch.linspace(-1, 1, n, dtype=dtype)[None, None, :, None]
    trend = position * torch.randn(1, heads, 1, d, generator=g, dtype=dtype)
    q, k, v = (torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))
    k = k + trend + torch.randn(1, heads, 1, d, generator=g, dtype=dtype)
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return Calibration(layer, q, k, v, valid, 0.7)


def reference_error(calib: Calibration, e: torch.Tensor, f: torch.Tensor) -> np.ndarray:
    """Each sequence's valid block alone, in numpy: ‖PV − softmax(Q (E K)ᵀ s)(F V)‖² / ‖PV‖²."""
    out = np.zeros((calib.sequences, calib.heads))
    for s in range(calib.sequences):
        m = int(calib.valid[s].sum())
        for h in range(calib.heads):
            q, k, v = (x[s, h, :m].numpy() for x in (calib.q, calib.k, calib.v))
            eh, fh = (x[h if x.shape[0] > 1 else 0, :, :m].numpy() for x in (e, f))

            def softmax(x):
                x = np.exp(x - x.max(-1, keepdims=True))
                return x / x.sum(-1, keepdims=True)

            exact = softmax(q @ k.T * calib.scaling) @ v
            approx = softmax(q @ (eh @ k).T * calib.scaling) @ (fh @ v)
            out[s, h] = ((exact - approx) ** 2).sum() / (exact ** 2).sum()
    return out


def test_objective_is_the_formula_on_each_valid_block() -> None:
    calib = synthetic()
    e, f = torch.randn(2, 4, 12, dtype=torch.float64), torch.randn(2, 4, 12, dtype=torch.float64)  # ≥ n columns
    assert np.allclose(head_output_error(calib, e, f).numpy(), reference_error(calib, e, f), atol=1e-12)


def test_objective_gradient_matches_finite_differences() -> None:
    calib = synthetic(lengths=(6, 4), n=6)
    e = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    f = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda e, f: head_output_error(calib, e, f), (e, f), eps=1e-6, atol=1e-7)


def test_identity_projections_are_exact_and_pooling_is_pool_mean() -> None:
    calib = synthetic(lengths=(10,) * 4)
    eye = torch.eye(10, dtype=torch.float64)
    assert head_output_error(calib, eye, eye).abs().max() < 1e-24
    assert torch.equal(pooling_matrix(10, 10, torch.float64), eye)
    for budget in (2, 5, 3):  # equal and uneven windows: the windows of methods.pooling on n valid positions
        want = mean_pooling_matrix(windows(torch.ones(1, 10, dtype=torch.bool), budget), budget, torch.float64)[0]
        assert torch.allclose(pooling_matrix(budget, 10, torch.float64), want, atol=0, rtol=1e-15)
    x = Layer(0, calib.q, calib.k, calib.v, calib.valid, calib.scaling)
    m = pooling_matrix(5, 10, torch.float64)  # equal windows: eq. 7 with E = F = M is pool-mean
    assert torch.allclose(linear_attention(calib.q, calib.k, calib.v, m, m, calib.valid, calib.scaling),
                          REGISTRY["pool-mean"].run(x, 5).out, atol=1e-12)


def padded_and_alone(calib: Calibration, s: int) -> tuple[Calibration, Calibration]:
    """The calibration with sequence s's padding filled with junk, and sequence s alone cut to its tokens."""
    m = int(calib.valid[s].sum())
    junk = [x.clone() for x in (calib.q, calib.k, calib.v)]
    for x in junk:
        x[:, :, m:] = torch.where(calib.valid[:, None, m:, None], x[:, :, m:], 1e3)
    padded = Calibration(0, *junk, calib.valid, calib.scaling)
    alone = Calibration(0, *(x[s:s + 1, :, :m] for x in (calib.q, calib.k, calib.v)), calib.valid[s:s + 1, :m],
                        calib.scaling)
    return padded, alone


def test_padding_contributes_its_valid_block_and_padded_keys_get_no_weight() -> None:
    calib = synthetic()
    padded, alone = padded_and_alone(calib, 2)  # m = 7 of n = 10
    e, f = torch.randn(2, 4, 10, dtype=torch.float64), torch.randn(2, 4, 10, dtype=torch.float64)
    errors = head_output_error(padded, e, f)
    assert torch.allclose(errors, head_output_error(calib, e, f), atol=1e-12), "junk in padding changes nothing"
    assert torch.allclose(errors[2], head_output_error(alone, e, f)[0], atol=1e-12), "first m columns"
    # PCA: a padded sequence adds its valid block, the same as the sequence alone
    one = calib.subset(torch.tensor([2]))
    raw = [pca_projections([c], 1, 2, 3, 10, "none", scale=False).pair(0) for c in (one, padded.subset([2]), alone)]
    for e_other, f_other in raw[1:]:
        assert torch.allclose(e_other, raw[0][0], atol=1e-10) and torch.allclose(f_other, raw[0][1], atol=1e-10)


def numpy_rows(moment: np.ndarray, budget: int) -> np.ndarray:
    values, vectors = np.linalg.eigh(moment)
    rows = vectors[:, ::-1][:, :budget].T
    return rows * np.sign(rows.sum(-1))[:, None]


@pytest.mark.parametrize("sharing", SHARINGS)
def test_pca_rows_are_the_top_eigenvectors_of_the_position_second_moment(sharing) -> None:
    calibs = [synthetic(layer, n=9, lengths=(9, 5, 9, 8)) for layer in range(2)]
    projections = pca_projections(calibs, 2, 2, 4, 11, sharing, scale=False)  # n = 11 > the calibrations' 9

    def moment(x: torch.Tensor, valid: torch.Tensor) -> np.ndarray:  # (H, 11, 11): padded rows zero
        x = np.pad((x * valid[:, None, :, None]).numpy(), ((0, 0), (0, 0), (0, 2), (0, 0)))
        return np.einsum("shid,shjd->hij", x, x)

    ck, cv = ([moment(getattr(c, which), c.valid) for c in calibs] for which in ("k", "v"))
    both = [ck[i].sum(0) / np.trace(ck[i].sum(0)) + cv[i].sum(0) / np.trace(cv[i].sum(0)) for i in range(2)]
    for layer in range(2):
        for head in range(2):
            want = {"none": (ck[layer][head], cv[layer][head]), "headwise": (ck[layer].sum(0), cv[layer].sum(0)),
                    "kv": (both[layer],) * 2, "layerwise": (both[0] + both[1],) * 2}[sharing]
            for which, covariance in zip("ef", want):
                got = projections.matrix(layer, head, which).numpy()
                assert np.allclose(got, numpy_rows(covariance, 4), atol=1e-9)
                assert np.allclose(got @ got.T, np.eye(4), atol=1e-12)


def test_principal_rows_sign_convention() -> None:
    rows = principal_rows(torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)), 2)
    assert torch.equal(rows, torch.tensor([[1.0, 0, 0], [0, 1.0, 0]], dtype=torch.float64))
    flipped = principal_rows(torch.tensor([[2.0, -1.9], [-1.9, 2.0]], dtype=torch.float64), 1)  # sums to 0
    assert flipped[0].max() > 0 and abs(flipped[0].sum()) < 1e-12


def mean_error(projections: Projections, calibs: list[Calibration], index=None) -> float:
    return float(np.mean([head_output_error(c if index is None else c.subset(index), *projections.pair(c.layer, c.n))
                          .mean().item() for c in calibs]))


@pytest.mark.parametrize("sharing", ["headwise", "kv"])
def test_pca_scales_are_the_best_positive_ones(sharing) -> None:
    calibs = [synthetic(layer) for layer in range(2)]
    raw = pca_projections(calibs, 2, 2, 3, 10, sharing, scale=False)
    scaled = pca_projections(calibs, 2, 2, 3, 10, sharing)
    for layer in range(2):
        for which in "ef":
            ratio = scaled.matrix(layer, 0, which) / raw.matrix(layer, 0, which)
            assert ratio.min() > 0 and torch.allclose(ratio, ratio.mean()), "one positive factor per matrix"
    best = mean_error(scaled, [calibs[0]])
    assert best < mean_error(raw, [calibs[0]])
    for factor in (0.97, 1.03):  # a local optimum in α (and in β for separate E, F)
        for which in ("e",) if sharing == "kv" else ("e", "f"):
            nudged = Projections(2, 2, 3, 10, sharing, weights={key: scaled.weights[name] for key, name in
                                                                zip(scaled.keys, scaled.weights)})
            with torch.no_grad():
                nudged.matrix(0, 0, which).mul_(factor)
            assert mean_error(nudged, [calibs[0]]) >= best - 1e-9


@pytest.fixture(scope="module")
def model_calibrations(roberta_dir) -> list[Calibration]:
    """A tiny pretrained-style model's own q, k, v: 16 padded sequences of n = 32, 2 layers, 4 heads of d = 8."""
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    model = AutoModel.from_pretrained(roberta_dir, attn_implementation=capture.NAME).eval()
    records: dict[int, list[capture.Captured]] = {0: [], 1: []}
    for start in range(0, 16, 8):
        batch = tokenizer(tiny.corpus_lines(16, seed=1)[start:start + 8], padding="max_length", truncation=True,
                          max_length=32, return_tensors="pt")
        capture.forward(model, 2, lambda c: records[c.layer].append(c), **batch)
    calibs = [Calibration.of(records[layer]) for layer in range(2)]
    assert not calibs[0].valid.all() and calibs[0].q.shape == (16, 4, 32, 8) and calibs[0].q.dtype == torch.float32
    assert calibs[0].nbytes == 4 * 16 * 4 * 32 * 8 * 4 + 16 * 32
    return calibs


@pytest.mark.parametrize("sharing", SHARINGS)
def test_fit_from_pooling_improves_and_keeps_the_best_validation_step(sharing, model_calibrations) -> None:
    calibs, steps = model_calibrations, 12
    fit = fit_projections(calibs, 2, 4, 4, 32, sharing, steps=steps, lr=0.3, seed=1)
    counts = {"none": 2 * 2 * 4, "headwise": 2 * 2, "kv": 2, "layerwise": 1}
    assert fit.projections.count == counts[sharing] and not any(p.requires_grad for p in fit.projections.parameters())
    pool = pooling_projections(2, 4, 4, 32, sharing)
    groups = [-1] if sharing == "layerwise" else [0, 1]
    assert sorted(fit.best_step) == groups and sorted(fit.history.layer.unique()) == groups
    for group in groups:
        members = calibs if group == -1 else [calibs[group]]
        train, held = validation_split(16, 0.25, seed=1)
        rows = fit.history[fit.history.layer == group].set_index("step")
        assert list(rows.index) == list(range(steps + 1)) and len(held) == 4
        assert rows.calibration[0] == pytest.approx(mean_error(pool, members, train), rel=1e-5), "step 0 is pooling"
        assert rows.validation[0] == pytest.approx(mean_error(pool, members, held), rel=1e-5)
        best = fit.best_step[group]
        candidates = rows[rows.calibration <= rows.calibration[0]]
        assert best == candidates.validation.idxmin()
        assert rows.calibration[best] <= rows.calibration[0] and rows.validation[best] <= rows.validation[0]
        assert rows.calibration[best] < 0.9 * rows.calibration[0] and best > 0, "the fit helps on this model"
        assert mean_error(fit.projections, members, train) == pytest.approx(rows.calibration[best], rel=1e-5)
        assert mean_error(fit.projections, members, held) == pytest.approx(rows.validation[best], rel=1e-5)


def test_fit_is_deterministic_and_the_seed_picks_the_validation_split(model_calibrations) -> None:
    seen = []
    run = lambda seed: fit_projections(model_calibrations, 2, 4, 4, 32, "headwise", steps=4, lr=0.3, seed=seed,
                                       progress=seen.append)
    a, b, c = run(3), run(3), run(4)
    assert all(torch.equal(x, y) for x, y in zip(a.projections.parameters(), b.projections.parameters()))
    assert a.history.equals(b.history) and len(seen) == 3 * 2 * 5 and seen[0] == a.history.iloc[0].to_dict()
    assert not torch.equal(validation_split(16, 0.25, 3)[1], validation_split(16, 0.25, 4)[1])
    assert not np.allclose(a.history.validation, c.history.validation)
    train, held = validation_split(16, 0.25, 3)
    assert len(held) == 4 and sorted(torch.cat([train, held]).tolist()) == list(range(16))


def test_fit_from_given_projections_and_without_validation(model_calibrations) -> None:
    calibs = model_calibrations
    pca = pca_projections(calibs, 2, 4, 4, 32, "kv")
    fit = fit_projections(calibs, 2, 4, 4, 32, "kv", init=pca, steps=3, lr=0.3, validation=0)
    rows = fit.history[fit.history.layer == 0]
    assert rows.calibration.iloc[0] == pytest.approx(mean_error(pca, calibs[:1]), rel=1e-5), "starts at the init"
    assert (rows.validation == rows.calibration).all(), "no hold-out: the calibration error decides"
    assert fit.best_step[0] == rows.step[rows.calibration.idxmin()]
    untouched = fit_projections(calibs[1:], 2, 4, 4, 32, "kv", init=pca, steps=2, lr=0.3)
    assert torch.equal(untouched.projections.matrix(0, 0, "e"), pca.matrix(0, 0, "e")), "uncalibrated layers keep init"


def test_pca_on_the_model_beats_raw_eigenvectors(model_calibrations) -> None:
    raw = pca_projections(model_calibrations, 2, 4, 4, 32, "headwise", scale=False)
    scaled = pca_projections(model_calibrations, 2, 4, 4, 32, "headwise")
    assert mean_error(scaled, model_calibrations) < min(1.0, mean_error(raw, model_calibrations))


@pytest.mark.parametrize("make, message", [
    (lambda c: pca_projections([c], 1, 2, 11, 10, "kv"), "exceeds n"),
    (lambda c: fit_projections([c], 1, 2, 11, 10, "kv"), "exceeds n"),
    (lambda c: pca_projections([], 1, 2, 3, 10, "kv"), "calibration set is empty"),
    (lambda c: fit_projections([], 1, 2, 3, 10, "kv"), "calibration set is empty"),
    (lambda c: pca_projections([c], 1, 3, 3, 10, "kv"), "has 2 heads"),
    (lambda c: pca_projections([c], 1, 2, 3, 8, "kv"), "10 tokens"),
    (lambda c: pca_projections([c, c], 1, 2, 3, 10, "kv"), "given twice"),
    (lambda c: pca_projections([c], 1, 2, 3, 10, "rowwise"), "unknown sharing"),
    (lambda c: fit_projections([c], 1, 2, 3, 10, "kv", validation=1.0), "validation must be a share"),
    (lambda c: fit_projections([c.subset([0])], 1, 2, 3, 10, "kv"), "needs ≥ 2 calibration sequences"),
    (lambda c: fit_projections([c], 1, 2, 3, 10, "kv", init=Projections(1, 2, 3, 10, "none")), "do not fit"),
    (lambda c: fit_projections([c], 1, 2, 3, 10, "kv", lr=0), "lr > 0"),
    (lambda c: Calibration(0, c.q, c.k, c.v[..., :2], c.valid, 1.0), "share one shape"),
    (lambda c: Calibration(0, c.q, c.k, c.v, c.valid[:, :5], 1.0), "valid has shape"),
    (lambda c: Calibration.of([]), "no captured record"),
    (lambda c: Calibration.of([capture.Captured.of(0, c.q, c.k, c.v, causal=True)]), "causal"),
])
def test_bad_input_is_one_line(make, message) -> None:
    with pytest.raises(SpectraError, match=message) as error:
        make(synthetic())
    assert "\n" not in str(error.value)
