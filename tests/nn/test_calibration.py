"""Calibration data and the objective of fixed Linformer projections: the objective against its formula on each
valid block and against finite differences, identity and pooling projections, padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibrations import reference_error, synthetic
from layers import draws
from spectra.methods import REGISTRY, Layer
from spectra.methods.pooling import mean_pooling_matrix, windows
from spectra.nn.calibration import Calibration, head_output_error, pooling_matrix
from spectra.nn.fit import pca_projections
from spectra.nn.linformer import linear_attention

pytestmark = pytest.mark.usefixtures("one_thread")


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
                          REGISTRY["pool-mean"](x, 5, draws(x)).out, atol=1e-12)


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


def test_a_subset_cuts_its_target_from_the_whole_formed_once(monkeypatch) -> None:
    """Fits take subsets at every step: P V is formed once on the whole calibration and sliced, and a slice is
    the target the subset alone would form (the dense softmax of its own valid blocks)."""
    calib = synthetic(lengths=(10, 7, 10, 4))
    index = torch.tensor([3, 1])
    alone = Calibration(calib.layer, calib.q[index], calib.k[index], calib.v[index], calib.valid[index],
                        calib.scaling)
    want = alone.target.clone()
    formed = []
    softmax = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda *args, **kwargs: formed.append(1) or softmax(*args, **kwargs))
    parts = [calib.subset(index) for _ in range(3)] + [calib.subset(slice(0, 2))]
    assert len(formed) == 1, "the whole calibration's P V is formed once (one chunk here), never per subset"
    for part in parts[:3]:
        assert torch.allclose(part.target, want, rtol=0, atol=1e-14)
    assert torch.equal(parts[3].target, calib.target[:2])


def test_a_causal_calibration_targets_causal_attention() -> None:
    """On a decoder's records the target P V has each query see the valid keys at or before it (dense numpy per
    sequence); whether a method may be fitted there is the method's to say, not the calibration's."""
    from spectra.capture import Captured

    calib = synthetic(lengths=(10, 7), n=10)
    mask = torch.zeros(2, 1, 10, 10, dtype=torch.float64)
    seen = calib.valid[:, None, None, :] & torch.ones(10, 10, dtype=torch.bool).tril()
    records = [Captured.of(0, calib.q, calib.k, calib.v, mask.masked_fill(~seen, torch.finfo(torch.float64).min), calib.scaling, causal=True)]
    causal = Calibration.of(records)
    assert causal.causal and not calib.causal and causal.subset([1]).causal
    for s, m in enumerate((10, 7)):
        for h in range(2):
            q, k, v = (x[s, h, :m].numpy() for x in (calib.q, calib.k, calib.v))
            scores = np.where(np.tril(np.ones((m, m), dtype=bool)), q @ k.T * calib.scaling, -np.inf)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            want = (p / p.sum(-1, keepdims=True)) @ v
            assert np.allclose(causal.target[s, h, :m].numpy(), want, atol=1e-12)
            assert not np.allclose(calib.target[s, h, :m].numpy(), want, atol=1e-3), "the bidirectional target differs"
