"""Every approximation against a dense numpy formula, its exact limits, and the error measures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra import linformer
from spectra.approximate import METHODS, Layer, expand_methods, check_budgets, measures
from spectra.errors import SpectraError

B, H, N, D = 2, 3, 12, 4


def layer(lengths=(N, N), projection="gaussian", seed=0) -> Layer:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(B, 1, N, N, dtype=torch.float64)
    for b, m in enumerate(lengths):
        mask[b, ..., m:] = torch.finfo(torch.float64).min
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.7 + mask, dim=-1)
    return Layer.captured(3, q, k, v, mask, p, 0.7, seed=seed, projection=projection)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def dense_p(x: Layer, b: int, h: int, m: int) -> np.ndarray:
    return softmax(x.q[b, h, :m].numpy() @ x.k[b, h, :m].numpy().T * 0.7)


@pytest.mark.parametrize("name", ["svd", "pool-mean", "pool-max"])
def test_full_budget_is_exact(name) -> None:
    x = layer(lengths=(N, 7))
    out = METHODS[name](x, N).out
    for b, m in enumerate((N, 7)):
        assert np.allclose(out[b, :, :m].numpy(), (x.p @ x.v)[b, :, :m].numpy(), atol=1e-10)


def test_jl_orthogonal_at_full_budget_is_exact() -> None:
    x = layer(projection="orthogonal")
    approx = METHODS["jl"](x, N)
    assert torch.allclose(approx.p, x.p, atol=1e-10) and torch.allclose(approx.out, x.p @ x.v, atol=1e-10)


def test_svd_is_numpy_truncated_svd() -> None:
    x = layer()
    approx = METHODS["svd"](x, 4)
    for b in range(B):
        for h in range(H):
            u, s, vt = np.linalg.svd(dense_p(x, b, h, N))
            assert np.allclose(approx.p[b, h].numpy(), (u[:, :4] * s[:4]) @ vt[:4], atol=1e-10)


def test_jl_is_p_rt_r_with_padded_columns_dropped() -> None:
    x = layer(lengths=(N, 8))
    approx = METHODS["jl"](x, 5)
    r = x.random(5).numpy()  # (H, 5, N)
    for h in range(H):
        p = dense_p(x, 1, h, 8)
        want = p @ r[h, :, :8].T @ r[h, :, :8]
        assert np.allclose(approx.p[1, h, :8, :8].numpy(), want, atol=1e-10)
        assert np.allclose(approx.out[1, h, :8].numpy(), want @ x.v[1, h, :8].numpy(), atol=1e-10)


@pytest.mark.parametrize("sharing", linformer.SHARING)
def test_linformer_is_eq7(sharing) -> None:
    x = layer(lengths=(N, 9))
    approx = METHODS[f"linformer({sharing})"](x, 5)
    e, f = linformer.jl_pair(sharing, 3, H, 5, N, 0)
    for b, m in enumerate((N, 9)):
        for h in range(H):
            ek = e[h, :, :m].double().numpy() @ x.k[b, h, :m].numpy()
            fv = f[h, :, :m].double().numpy() @ x.v[b, h, :m].numpy()
            want = softmax(x.q[b, h, :m].numpy() @ ek.T * 0.7) @ fv
            assert np.allclose(approx.out[b, h, :m].numpy(), want, atol=1e-6)
    module = linformer.linear_attention(x.q, x.k, x.v, e.double(), f.double(), None, 0.7)
    assert torch.allclose(approx.out[0], module[0], atol=1e-10), "the registry uses the Linformer module's eq. 7"


def test_pooling_windows_and_formulas() -> None:
    x = layer(lengths=(N, 10))
    budget, m = 3, 10
    windows = [range(0, 4), range(4, 7), range(7, 10)]  # ⌊rank·3/10⌋
    mean, top = METHODS["pool-mean"](x, budget), METHODS["pool-max"](x, budget)
    for h in range(H):
        q, k, v = (t[1, h].numpy() for t in (x.q, x.k, x.v))
        sizes = np.log([len(w) for w in windows])
        for reduce, approx in ((np.mean, mean), (np.max, top)):
            k_bar = np.stack([reduce(k[list(w)], axis=0) for w in windows])
            v_bar = np.stack([reduce(v[list(w)], axis=0) for w in windows])
            want = softmax(q[:m] @ k_bar.T * 0.7 + sizes) @ v_bar
            assert np.allclose(approx.out[1, h, :m].numpy(), want, atol=1e-10)
    assert top.p is None and mean.p is not None
    assert torch.allclose(mean.p[1, :, :m].sum(-1), torch.ones(H, m, dtype=torch.float64))


def test_measures_against_numpy() -> None:
    x = layer(lengths=(N, 6))
    approx = METHODS["jl"](x, 4)
    got = measures(x, approx)
    for b, m in enumerate((N, 6)):
        for h in range(H):
            p, p_t = x.p[b, h, :m, :m].numpy(), approx.p[b, h, :m, :m].numpy()
            exact, out = p @ x.v[b, h, :m].numpy(), approx.out[b, h, :m].numpy()
            assert got[0, b, h] == pytest.approx(np.linalg.norm(out - exact) / np.linalg.norm(exact))
            assert got[1, b, h] == pytest.approx(np.linalg.norm(p - p_t) / np.linalg.norm(p))
            pos = np.clip(p_t, 0, None)
            tv = [0.5 * np.abs(p[i] - pos[i] / pos[i].sum()).sum() if pos[i].sum() > 0 else 1.0 for i in range(m)]
            assert got[2, b, h] == pytest.approx(np.mean(tv))
    assert measures(x, METHODS["pool-max"](x, 4))[1:].isnan().all()


def test_names_and_budgets() -> None:
    assert expand_methods(["svd", "linformer"]) == ["svd"] + [f"linformer({s})" for s in linformer.SHARING]
    assert expand_methods(["linformer(kv)"]) == ["linformer(kv)"]
    with pytest.raises(SpectraError, match="unknown method 'lsh'; valid methods: .*pool-mean"):
        expand_methods(["lsh"])
    with pytest.raises(SpectraError, match="k = 0"):
        check_budgets([0], 8)
    with pytest.raises(SpectraError, match="exceeds the sequence length n = 8"):
        check_budgets([4, 9], 8)
