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
from calibrations import synthetic
from spectra.nn.calibration import Calibration, head_output_error, pooling_projections
from spectra.nn.descent import validation_split
from spectra.nn.fit import fit_projections, pca_projections, principal_rows
from spectra.nn.projections import Projections

pytestmark = pytest.mark.usefixtures("one_thread")

SHARINGS = ("none", "headwise", "kv", "layerwise")


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
        capture.forward(model, 2, lambda c: records[c.layer].append(c), index=range(start, start + 8), **batch)
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
    (lambda c: Calibration.of([capture.Captured.of(0, c.q, c.k, c.v, causal=True), capture.Captured.of(0, c.q, c.k,
                                                                                                      c.v)]),
     "same layer, scaling and causality"),
])
def test_bad_input_is_one_line(make, message) -> None:
    with pytest.raises(SpectraError, match=message) as error:
        make(synthetic())
    assert "\n" not in str(error.value)
