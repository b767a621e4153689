"""The attention primitives against numpy written out one row at a time: the scaled scores, the keys a query may
see (padding, causality, left padding), the masked softmax (and its zero rows), eager attention's P (bitwise the
transformers formula), and eq. 7 — projected, attended and dense — with per-head, shared and per-sequence
projections."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kernels import (
    allowed,
    attend,
    causal_mask,
    eager_p,
    eager_softmax,
    eq7,
    masked_softmax,
    project,
    scores,
)

B, H, N, D, BUDGET = 2, 3, 9, 4, 5
S = 0.6


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def gaussian(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return gaussian(B, H, N, D, seed=seed), gaussian(B, H, N, D, seed=seed + 1), gaussian(B, H, N, D, seed=seed + 2)


def right_padded(lengths=(N, 6)) -> torch.Tensor:
    return torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]


def left_padded(lengths=(N, 6)) -> torch.Tensor:
    return torch.arange(N)[None, :] >= N - torch.tensor(lengths)[:, None]


def test_scores_are_the_scaled_dot_products() -> None:
    q, k, _ = qkv()
    got = scores(q, k[:, :, :7], S)
    assert got.shape == (B, H, N, 7)
    for b in range(B):
        for h in range(H):
            assert np.allclose(got[b, h].numpy(), q[b, h].numpy() @ k[b, h, :7].numpy().T * S, atol=1e-12)


@pytest.mark.parametrize("padded", [right_padded, left_padded])
def test_allowed_keys_are_the_valid_ones_and_for_causal_attention_no_later_one(padded) -> None:
    valid = padded()
    assert allowed(valid).shape == (B, 1, 1, N) and torch.equal(allowed(valid)[:, 0, 0], valid)
    causal = allowed(valid, causal=True)
    assert causal.shape == (B, 1, N, N)
    for b in range(B):
        for i in range(N):
            want = [bool(valid[b, j]) and j <= i for j in range(N)]
            assert causal[b, 0, i].tolist() == want, (b, i)


@pytest.mark.parametrize("padded", [right_padded, left_padded])
@pytest.mark.parametrize("causal", [False, True])
def test_masked_softmax_is_the_softmax_over_the_kept_keys_and_zero_elsewhere(padded, causal) -> None:
    q, k, _ = qkv(3)
    valid = padded()
    p = masked_softmax(scores(q, k, S), allowed(valid, causal))
    for b in range(B):
        for h in range(H):
            for i in range(N):
                seen = [j for j in range(N) if valid[b, j] and (j <= i or not causal)]
                want = np.zeros(N)
                if seen:
                    want[seen] = softmax(q[b, h, i].numpy() @ k[b, h, seen].numpy().T * S)
                assert np.allclose(p[b, h, i].numpy(), want, atol=1e-12), (b, h, i)
    if causal and padded is left_padded:  # the left-padded query rows of a decoder see no key: zero, not NaN
        assert (p[1, :, :N - 6] == 0).all() and torch.isfinite(p).all()


def test_masked_softmax_of_a_row_keeping_nothing_is_zero_and_its_gradient_finite() -> None:
    logits = gaussian(2, 4).requires_grad_()
    keep = torch.tensor([[True, False, True, False], [False, False, False, False]])
    p = masked_softmax(logits, keep)
    assert (p[1] == 0).all() and torch.allclose(p[0].sum(), torch.tensor(1.0, dtype=torch.float64))
    p[0, 0].backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[1] == 0).all()


def test_eager_p_is_transformers_eager_formula_bit_for_bit() -> None:
    """The operations of transformers' eager attention in their order (matmul, scale, add the mask, softmax)."""
    q, k, _ = (t.float() for t in qkv(5))
    mask = torch.zeros(B, 1, N, N).masked_fill(~right_padded()[:, None, None, :], torch.finfo(torch.float32).min)
    want = torch.nn.functional.softmax(torch.matmul(q, k.transpose(2, 3)) * S + mask, dim=-1)
    assert torch.equal(eager_p(q, k, S, mask), want)
    assert torch.equal(eager_p(q, k, S), torch.nn.functional.softmax(torch.matmul(q, k.transpose(2, 3)) * S, dim=-1))


def test_project_projects_the_valid_rows_with_the_first_n_columns() -> None:
    _, k, _ = qkv(7)
    valid = right_padded()
    for proj in (gaussian(BUDGET, N + 3, seed=8), gaussian(H, BUDGET, N + 3, seed=9), gaussian(1, BUDGET, N + 3, seed=10),
                 gaussian(B, H, BUDGET, N + 3, seed=11)):
        got = project(k, proj, valid)
        assert got.shape == (B, H, BUDGET, D)
        for b in range(B):
            m = int(valid[b].sum())
            for h in range(H):
                e = proj if proj.dim() == 2 else proj[b, h] if proj.dim() == 4 else proj[min(h, proj.shape[0] - 1)]
                want = e[:, :m].numpy() @ k[b, h, :m].numpy()
                assert np.allclose(got[b, h].numpy(), want, atol=1e-12), (proj.shape, b, h)
    with pytest.raises(SpectraError, match="longer than the projection's 8 columns; use projections with max_len ≥ 9"):
        project(k, gaussian(BUDGET, N - 1), valid)


def test_attend_defaults_to_one_over_root_d() -> None:
    q, k, v = qkv(12)
    k_bar, v_bar = k[:, :, :BUDGET], v[:, :, :BUDGET]
    assert torch.equal(attend(q, k_bar, v_bar), attend(q, k_bar, v_bar, D ** -0.5))
    got = attend(q, k_bar, v_bar, S)
    for b in range(B):
        for h in range(H):
            want = softmax(q[b, h].numpy() @ k_bar[b, h].numpy().T * S) @ v_bar[b, h].numpy()
            assert np.allclose(got[b, h].numpy(), want, atol=1e-12)


@pytest.mark.parametrize("per_sequence", [False, True])
def test_eq7_is_the_dense_formula_on_each_sequence_alone(per_sequence) -> None:
    """softmax(Q (E K)ᵀ s)(F V) on each sequence's m valid tokens with E, F's first m columns, in numpy; the dense
    form's P̃ = softmax(Q (E K)ᵀ s) F has zero padded columns and gives the same output."""
    q, k, v = qkv(13)
    valid = right_padded()
    shape = (B, H, BUDGET, N) if per_sequence else (H, BUDGET, N)
    e, f = gaussian(*shape, seed=14), gaussian(*shape, seed=15)
    out, none = eq7(q, k, v, e, f, valid, S)
    dense, p_tilde = eq7(q, k, v, e, f, valid, S, dense=True)
    assert none is None and p_tilde.shape == (B, H, N, N)
    for b in range(B):
        m = int(valid[b].sum())
        assert (p_tilde[b, :, :, m:] == 0).all()
        for h in range(H):
            eh, fh = (x[b, h] if per_sequence else x[h] for x in (e, f))
            qh, kh, vh = (x[b, h, :m].numpy() for x in (q, k, v))
            p_bar = softmax(qh @ (eh[:, :m].numpy() @ kh).T * S)
            want = p_bar @ (fh[:, :m].numpy() @ vh)
            assert np.allclose(out[b, h, :m].numpy(), want, atol=1e-12), (b, h)
            assert np.allclose(dense[b, h, :m].numpy(), want, atol=1e-12), (b, h)
            assert np.allclose(p_tilde[b, h, :m, :m].numpy(), p_bar @ fh[:, :m].numpy(), atol=1e-12)


def test_the_causal_mask_places_the_queries_last() -> None:
    mask = causal_mask(3, 7).numpy()
    want = np.array([[j <= 7 - 3 + i for j in range(7)] for i in range(3)])
    assert mask.shape == (3, 7) and (mask == want).all()
    assert (causal_mask(N, N).numpy() == np.tril(np.ones((N, N), dtype=bool))).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_eager_softmax_is_eager_attentions_masked_row(dtype: torch.dtype) -> None:
    """Hidden entries take no weight, the kept ones a float32 (float64 for float64) softmax, cast back."""
    logits = gaussian(H, 4, N).to(dtype)
    keep = torch.from_numpy(np.tril(np.ones((4, N), dtype=bool), k=N - 4))
    p = eager_softmax(logits, keep, dtype)
    assert p.dtype == dtype
    wide = logits.double().numpy()
    want = np.where(keep.numpy(), np.exp(wide - np.where(keep.numpy(), wide, -np.inf).max(-1, keepdims=True)), 0.0)
    want /= want.sum(-1, keepdims=True)
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float64: 1e-14}[dtype]
    np.testing.assert_allclose(p.double().numpy(), want, atol=tolerance, rtol=0)
