"""Bounds against hand-computed values, the JL lemma on synthetic vectors, errors against dense formulas,
streaming statistics against numpy, and the Theorem 1/2 probes (padding, seeds, bad input)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from spectra.errors import SpectraError
from spectra.linformer import Projections, linear_attention
from spectra.stats import ErrorStats
from spectra.theory import (
    Theorem1Probe,
    Theorem2Probe,
    attention_probs,
    best_rank_errors,
    delta_value,
    feed,
    gaussian_qkv,
    jl_failure_bound,
    jl_inner_errors,
    jl_matrix,
    orthogonal_matrix,
    padding_mask,
    theorem1_bound,
    theorem1_errors,
    theorem1_k,
    theorem2_errors,
    theorem2_k,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


pytestmark = pytest.mark.usefixtures("one_thread")


def test_bounds_against_hand_computed_values() -> None:
    # natural log: 5 ln 512 / (0.25 − 0.125) = 40 · 6.238325 = 249.533
    assert theorem1_k(0.5, 512) == pytest.approx(249.5330, abs=1e-3)
    assert theorem1_k(0.1, 512) == pytest.approx(5 * 6.2383246 / 0.009, rel=1e-6)
    assert jl_failure_bound(0.5, 64) == pytest.approx(2 * math.exp(-2.0))  # 0.125 · 64 / 4 = 2
    assert jl_failure_bound(0.5, 64) == pytest.approx(0.2706706, rel=1e-6)
    assert theorem1_bound(0.5, 512, 256) == pytest.approx(1 - 1024 * math.exp(-8.0))  # 0.6565
    assert theorem1_bound(0.5, 512, 256) == pytest.approx(0.6564863, rel=1e-6)
    assert theorem1_bound(0.5, 512, 64) == 0.0  # 1 − 1024 · 0.135 < 0
    # min{9 · 64 · ln 64, 5 ln 512} / 0.25 = min{2395.5, 31.19} / 0.25
    assert theorem2_k(0.5, 512, 64) == pytest.approx(124.7665, abs=1e-3)
    assert theorem2_k(0.5, 10**9, 2) == pytest.approx(9 * 2 * math.log(2) / 0.25)
    assert delta_value("1/n", 512) == 1 / 512
    assert delta_value("1/2^n", 512) == 2.0**-512
    assert delta_value("1/2^n", 1074) > 0 and delta_value("1/2^n", 1075) == 0.0  # float64 underflow
    assert delta_value(0.3, 512) == 0.3


def test_jl_matrix_seeds_scale_and_slicing() -> None:
    r = jl_matrix(64, 300, seed=3)
    assert r.shape == (64, 300) and r.dtype == torch.float32
    assert torch.equal(r, jl_matrix(64, 300, seed=3))
    assert not torch.equal(r, jl_matrix(64, 300, seed=4))
    assert torch.equal(r[:, :123], jl_matrix(64, 123, seed=3))  # slicing rule is free
    assert abs(r.var().item() - 1 / 64) < 0.001
    q = orthogonal_matrix(40, 40, seed=1)
    assert torch.allclose(q.T @ q, torch.eye(40), atol=1e-5)
    wide = orthogonal_matrix(10, 40, seed=1)
    assert torch.allclose(wide @ wide.T, 4 * torch.eye(10), atol=1e-5)  # rows orthonormal · √(n/k)


@pytest.mark.parametrize("eps,k_proj", [(0.5, 32), (0.5, 64), (0.3, 128)])
def test_jl_lemma_failure_rate_is_within_the_bound(eps, k_proj) -> None:
    """Over 1500 seeds of R, Pr(|x RᵀR yᵀ − x yᵀ| > ε‖x‖‖y‖) ≤ 2e^{−(ε²−ε³)k/4}."""
    generator = np.random.default_rng(0)
    x, y = torch.from_numpy(generator.standard_normal((2, 256))).float()
    y = 0.6 * x + 0.8 * y  # correlated, so x yᵀ ≠ 0
    r = torch.stack([jl_matrix(k_proj, 256, seed) for seed in range(1500)])
    failure = (jl_inner_errors(x, y, r) > eps).float().mean().item()
    assert failure <= jl_failure_bound(eps, k_proj)
    # the check can fail: R with 4× the variance breaks the lemma
    assert (jl_inner_errors(x, y, 2 * r[:300]) > eps).float().mean().item() > jl_failure_bound(eps, k_proj)


def test_theorem1_probe_against_the_lemma_on_synthetic_vectors() -> None:
    """P = 1 xᵀ and V = xᵀ make the probe's error |‖Rx‖² − ‖x‖²| / ‖x‖², the lemma's x = y case; one R per layer."""
    n, layers = 64, 300
    x = torch.softmax(torch.from_numpy(np.random.default_rng(1).standard_normal(n)).float(), dim=0)
    p = x.expand(n, n)[None, None]
    v = x[None, None, :, None]
    probe = Theorem1Probe(layers, 1, n, [32, 64], [0.3, 0.5], best_rank=False, seed=2)
    for layer in range(layers):
        probe.update(layer, v, v, v, None, p)
    table = probe.result()
    assert (table["samples"] == 1).all()
    rates = table.groupby(["k_proj", "eps"])["pr"].mean()
    for (k_proj, eps), rate in rates.items():
        assert 1 - rate <= jl_failure_bound(eps, k_proj), (k_proj, eps, rate)
    direct = [abs((probe.r(layer, 64) @ x).square().sum() / x.square().sum() - 1).item() for layer in range(layers)]
    assert rates[(64, 0.5)] == pytest.approx(np.mean(np.array(direct) <= 0.5))


def test_theorem1_errors_against_dense() -> None:
    q, k, v = gaussian_qkv(24, 5, heads=2, batch=2, seed=0)
    p = attention_probs(q, k)
    r = jl_matrix(8, 30, seed=1)
    got = theorem1_errors(p, v, r)
    assert got.shape == (2, 2, 5)
    p_tilde = p @ r[:, :24].T @ r[:, :24]  # rank ≤ 8
    assert torch.linalg.matrix_rank(p_tilde[0, 0]).item() <= 8
    for b in range(2):
        for h in range(2):
            for col in range(5):
                w = v[b, h, :, col]
                want = (p_tilde[b, h] @ w - p[b, h] @ w).norm() / (p[b, h] @ w).norm()
                assert got[b, h, col].item() == pytest.approx(want.item(), rel=1e-4)


def test_best_rank_errors_against_numpy_svd() -> None:
    q, k, v = gaussian_qkv(20, 4, heads=2, batch=1, seed=5)
    p = attention_probs(q, k)
    got = best_rank_errors(p, v, [1, 5, 20])
    assert got.shape == (3, 1, 2, 4)
    u, s, vt = np.linalg.svd(p[0, 1].double().numpy())
    for i, k_proj in enumerate([1, 5, 20]):
        p_k = u[:, :k_proj] * s[:k_proj] @ vt[:k_proj]
        w = v[0, 1].double().numpy()
        dense = p[0, 1].double().numpy()
        want = np.linalg.norm(p_k @ w - dense @ w, axis=0) / np.linalg.norm(dense @ w, axis=0)
        assert np.allclose(got[i, 0, 1].numpy(), want, atol=1e-4)
    assert got[2].abs().max() < 1e-3  # full rank reproduces P


def test_k_equals_n_with_orthogonal_projection_is_exact() -> None:
    q, k, v = gaussian_qkv(32, 6, heads=2, batch=2, seed=2)
    p = attention_probs(q, k)
    assert theorem1_errors(p, v, orthogonal_matrix(32, 32, seed=3)).max() < 1e-4
    assert theorem1_errors(p, v, jl_matrix(32, 32, seed=3)).max() > 1e-2  # JL is only approximately isometric


def test_theorem2_errors_against_dense_rows() -> None:
    q, k, v = gaussian_qkv(16, 4, heads=2, batch=2, seed=9)
    a = q @ k.transpose(-1, -2) / 2.0
    r = jl_matrix(6, 16, seed=0)
    valid = torch.ones(2, 16, dtype=torch.bool)
    valid[1, 11:] = False
    deltas = [torch.tensor([0.5, 0.25], dtype=torch.float64), 1.0]
    rhs, out = theorem2_errors(a, v, r, deltas, valid)
    assert rhs.shape == out.shape == (2, 2, 2, 16)
    for i, delta in enumerate(deltas):
        for b, m in enumerate([16, 11]):
            dv = float(delta[b]) if torch.is_tensor(delta) else delta
            e, f, vb = dv * r[:, :m], math.exp(-dv) * r[:, :m], v[b, :, :m]
            for h in range(2):
                for row in range(m):
                    w = a[b, h, row, :m]
                    exact = torch.softmax(w, 0) @ vb[h]
                    err = (torch.softmax(w @ e.T, 0) @ (f @ vb[h]) - exact).norm()
                    theorem_rhs = torch.softmax(w, 0).norm() * vb[h].norm()  # Frobenius norm of V
                    assert rhs[i, b, h, row].item() == pytest.approx((err / theorem_rhs).item(), rel=1e-4)
                    assert out[i, b, h, row].item() == pytest.approx((err / exact.norm()).item(), rel=1e-4)


def test_tiny_delta_is_the_uniform_limit() -> None:
    q, k, v = gaussian_qkv(64, 4, seed=1)
    a = attention_probs(q, k).log()
    r = jl_matrix(8, 64, seed=0)
    rhs, out = theorem2_errors(a, v, r, [delta_value("1/2^n", 64), delta_value("1/2^n", 2000), 0.0])
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    uniform = (r @ v[0, 0]).mean(0)  # softmax(0) = 1/k, F = R
    exact = attention_probs(q, k)[0, 0] @ v[0, 0]
    assert torch.allclose(out[2, 0, 0], (uniform - exact).norm(dim=-1) / exact.norm(dim=-1), rtol=1e-4)


def test_error_stats_against_numpy_and_batching() -> None:
    generator = np.random.default_rng(0)
    samples = np.exp(generator.normal(-2.0, 1.5, size=(2, 3, 20000)))
    samples[0, 0, :5] = 0.0  # exact zeros go to the underflow bin
    samples[1, 2, :50] = 1e5  # beyond the overflow edge
    whole = ErrorStats((2, 3), [0.01, 0.1, 0.5])
    whole.add((), torch.from_numpy(samples))
    pieces = ErrorStats((2, 3), [0.01, 0.1, 0.5])
    for chunk in np.array_split(samples, 7, axis=-1):
        for row in range(2):
            pieces.add(row, torch.from_numpy(chunk[row]))
    for name in ("count", "below", "hist"):
        assert np.array_equal(getattr(whole, name), getattr(pieces, name))
    assert np.allclose(whole.total, pieces.total) and np.array_equal(whole.max, pieces.max)
    assert np.array_equal(whole.below, (samples[..., None] <= np.array([0.01, 0.1, 0.5])).sum(-2))
    coarse = ErrorStats((2, 3), [0.5], per_decade=10)  # 26% wide bins: interpolation inside a bin matters
    coarse.add((), torch.from_numpy(samples))
    for q in (0.5, 0.95):
        want = np.quantile(samples, q, axis=-1)
        assert np.allclose(whole.quantile(q), want, rtol=0.025)
        assert np.allclose(coarse.quantile(q), want, rtol=0.015)
    frame = whole.frame({"a": [0, 1], "b": ["x", "y", "z"]})
    assert len(frame) == 2 * 3 * 3
    row = frame[(frame["a"] == 1) & (frame["b"] == "z") & (frame["eps"] == 0.1)].iloc[0]
    assert row["pr"] == pytest.approx((samples[1, 2] <= 0.1).mean())
    assert row["mean"] == pytest.approx(samples[1, 2].mean()) and row["max"] == 1e5
    restored = ErrorStats((2, 3), [0.01, 0.1, 0.5])
    restored.load_state(whole.state("x"), "x")
    assert restored.frame({"a": [0, 1], "b": ["x", "y", "z"]}).equals(frame)
    keep = torch.zeros(2, 3, 20000, dtype=torch.bool)
    keep[..., :100] = True
    kept = ErrorStats((2, 3), [0.5])
    kept.add((), torch.from_numpy(samples), keep)
    assert (kept.count == 100).all()
    assert np.allclose(kept.total, samples[..., :100].sum(-1))


def _frames_close(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for column in a.columns:
        if a[column].dtype.kind in "fi":
            assert np.allclose(a[column].to_numpy(float), b[column].to_numpy(float), rtol=1e-4, equal_nan=True), column
        else:
            assert (a[column] == b[column]).all(), column


@pytest.mark.parametrize("make", [
    lambda: Theorem1Probe(2, 2, 32, [4, 16], [0.2, 0.5], seed=1),
    lambda: Theorem2Probe(2, 2, 32, [4, 16], [0.2, 0.5], seed=1, deltas=("1/2^n", "1/n", 0.5)),
])
def test_probes_padded_batch_equals_sequences_alone(make) -> None:
    q, k, v = gaussian_qkv(32, 4, heads=2, batch=2, seed=4)
    mask = padding_mask([32, 21], 32)
    batched, alone = make(), make()
    for layer in range(2):
        feed([batched], layer, q, k, v, mask)
        feed([alone], layer, q[:1], k[:1], v[:1])
        feed([alone], layer, q[1:, :, :21], k[1:, :, :21], v[1:, :, :21])
    _frames_close(batched.result(), alone.result())
    samples = batched.result()["samples"]
    per_sequence = 4 if isinstance(batched, Theorem1Probe) else None  # columns of V, or valid query rows
    assert (samples == (2 * per_sequence if per_sequence else 32 + 21)).all()


def test_probes_are_deterministic_and_seeded() -> None:
    q, k, v = gaussian_qkv(32, 4, heads=2, batch=3, seed=0)

    def run(seed: int, batches: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        probes = [Theorem1Probe(1, 2, 32, [8], [0.5], seed=seed), Theorem2Probe(1, 2, 32, [8], [0.5], seed=seed)]
        for part in np.array_split(np.arange(3), batches):
            feed(probes, 0, q[part], k[part], v[part])
        return probes[0].result(), probes[1].result()

    first, again, split = run(0, 1), run(0, 1), run(0, 3)
    for a, b, c in zip(first, again, split):
        assert a.equals(b)
        _frames_close(a, c)
    other = run(1, 1)
    jl_rows = first[0]["method"] == "jl"
    assert not np.allclose(first[0].loc[jl_rows, "mean"], other[0].loc[jl_rows, "mean"])
    assert np.allclose(first[0].loc[~jl_rows, "mean"], other[0].loc[~jl_rows, "mean"])  # SVD has no randomness


def test_theorem1_probe_table() -> None:
    q, k, v = gaussian_qkv(32, 4, heads=2, batch=2, seed=4)
    probe = Theorem1Probe(1, 2, 32, [32, 8], [0.5, 0.2], seed=0)
    p = feed([probe], 0, q, k, v)
    table = probe.result()
    assert list(table.columns) == ["layer", "head", "k_proj", "method", "eps", "pr", "samples", "median", "p95",
                                   "mean", "max", "n", "bound", "k_theory"]
    assert len(table) == 2 * 2 * 2 * 2
    row = table[(table["head"] == 1) & (table["k_proj"] == 8) & (table["method"] == "jl") & (table["eps"] == 0.2)].iloc[0]
    errors = theorem1_errors(p, v, probe.r(0, 8))[:, 1].flatten().numpy()
    assert row["pr"] == pytest.approx((errors <= 0.2).mean())
    assert row["mean"] == pytest.approx(errors.mean(), rel=1e-5)
    assert row["median"] == pytest.approx(np.median(errors), rel=0.05)
    assert row["bound"] == theorem1_bound(0.2, 32, 8) and row["k_theory"] == theorem1_k(0.2, 32)
    exact = table[(table["k_proj"] == 32) & (table["method"] == "svd")]
    assert (exact["max"] < 1e-3).all() and (exact["pr"] == 1.0).all()


def test_theorem2_probe_table_and_architecture_rows() -> None:
    q, k, v = gaussian_qkv(32, 4, heads=2, batch=2, seed=4)
    probe = Theorem2Probe(1, 2, 32, [8], [0.5], seed=3, deltas=("1/2^n", 0.5))
    feed([probe], 0, q, k, v)
    table = probe.result()
    assert list(table.columns) == ["layer", "head", "k_proj", "method", "variant", "relative_to", "eps", "pr", "samples",
                                   "median", "p95", "mean", "max", "n", "d", "delta", "k_theory"]
    assert set(zip(table["method"], table["variant"], table["relative_to"])) == {
        ("theorem2", "delta=1/2^n", "rhs"), ("theorem2", "delta=1/2^n", "output"),
        ("theorem2", "delta=0.5", "rhs"), ("theorem2", "delta=0.5", "output"),
        ("linformer", "none", "output"), ("linformer", "headwise", "output"),
        ("linformer", "kv", "output"), ("linformer", "layerwise", "output"),
    }
    assert (table["k_theory"] == theorem2_k(0.5, 32, 4)).all()
    assert table.loc[table["variant"] == "delta=1/2^n", "delta"].eq(2.0**-32).all()
    # the architecture rows are eq. 7 with the matrices Projections(init="jl") holds
    projections = Projections(1, 2, 8, 32, "kv", seed=3)
    approx = linear_attention(q, k, v, *projections.pair(0))
    exact = attention_probs(q, k) @ v
    errors = ((approx - exact).norm(dim=-1) / exact.norm(dim=-1))[:, 0].flatten()
    row = table[(table["variant"] == "kv") & (table["head"] == 0)].iloc[0]
    assert row["mean"] == pytest.approx(errors.mean().item(), rel=1e-5)


def test_theorem2_probe_uses_the_passed_scaling_and_checks_it() -> None:
    q, k, v = gaussian_qkv(16, 4, heads=1, seed=0)
    p = attention_probs(q, k, scaling=1.0)
    with pytest.raises(SpectraError, match="scaling"):
        Theorem2Probe(1, 1, 16, [4], [0.5]).update(0, q, k, v, None, p)  # 1/√d assumed, P made with 1.0
    Theorem2Probe(1, 1, 16, [4], [0.5], scaling=1.0).update(0, q, k, v, None, p)
    passed, own = Theorem2Probe(1, 1, 16, [4], [0.5]), Theorem2Probe(1, 1, 16, [4], [0.5], scaling=1.0)
    passed.update(0, q, k, v, None, p, scaling=1.0)  # as the capture attention calls it
    feed([own], 0, q, k, v, scaling=1.0)
    assert passed.result().equals(own.result())


def test_bad_input_is_one_line() -> None:
    cases = [
        (lambda: Theorem1Probe(1, 1, 32, [0, 8], [0.5]), "positive integer"),
        (lambda: Theorem1Probe(1, 1, 32, [64], [0.5]), "exceeds"),
        (lambda: Theorem1Probe(1, 1, 32, [], [0.5]), "sweep is empty"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [0.0]), "strictly between 0 and 1"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [1.0]), "strictly between 0 and 1"),
        (lambda: Theorem1Probe(1, 1, 32, [8], [1.5]), "strictly between 0 and 1"),
        (lambda: Theorem1Probe(1, 1, 32, [8], []), "ε list is empty"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [0.5], deltas=("1/n^2",)), "unknown delta"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [0.5], sharing=("rows",)), "unknown sharing"),
        (lambda: theorem1_k(-0.1, 512), "strictly between 0 and 1"),
        (lambda: jl_failure_bound(0.5, 0), "positive integer"),
        (lambda: orthogonal_matrix(10, 8), "exceeds"),
        (lambda: jl_matrix(0, 8), "positive integer"),
    ]
    for make, message in cases:
        with pytest.raises(SpectraError, match=message) as error:
            make()
        assert "\n" not in str(error.value)
    probe = Theorem1Probe(2, 2, 16, [4], [0.5])
    q, k, v = gaussian_qkv(20, 4, heads=2, seed=0)
    with pytest.raises(SpectraError, match="sequences of ≤ 16 tokens"):
        feed([probe], 0, q, k, v)


def test_gaussian_qkv_is_seeded() -> None:
    q, k, v = gaussian_qkv(8, 4, heads=3, batch=2, seed=1)
    assert q.shape == k.shape == v.shape == (2, 3, 8, 4)
    assert torch.equal(q, gaussian_qkv(8, 4, heads=3, batch=2, seed=1)[0])
    assert not torch.equal(q, gaussian_qkv(8, 4, heads=3, batch=2, seed=2)[0])
    assert not torch.equal(q, k)


@pytest.mark.parametrize("device", DEVICES)
def test_probes_run_on_the_tensors_device(device) -> None:
    q, k, v = (t.to(device) for t in gaussian_qkv(16, 4, heads=2, batch=2, seed=0))
    mask = padding_mask([16, 9], 16, device=device)
    probes = [Theorem1Probe(1, 2, 16, [4, 8], [0.5]), Theorem2Probe(1, 2, 16, [4], [0.5])]
    feed(probes, 0, q, k, v, mask)
    on_cpu = [Theorem1Probe(1, 2, 16, [4, 8], [0.5]), Theorem2Probe(1, 2, 16, [4], [0.5])]
    feed(on_cpu, 0, q.cpu(), k.cpu(), v.cpu(), mask.cpu())
    for probe, reference in zip(probes, on_cpu):
        _frames_close(probe.result(), reference.result())


def test_probes_inside_a_model_forward() -> None:
    """The probes run under the capture attention (padded batch) and match feeding the same q, k, v by hand."""
    from transformers import AutoModel, BertConfig

    from spectra import capture

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=24)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation=capture.NAME).eval()
    input_ids = torch.randint(5, 50, (2, 24))
    attention_mask = torch.ones(2, 24, dtype=torch.long)
    attention_mask[1, 17:] = 0

    def make() -> list:
        return [Theorem1Probe(2, 2, 24, [4, 12], [0.3, 0.5]), Theorem2Probe(2, 2, 24, [4, 12], [0.3, 0.5])]

    class Recorder:
        def __init__(self) -> None:
            self.seen: dict[int, tuple] = {}

        def update(self, layer, q, k, v, mask, p, *, scaling) -> None:
            self.seen[layer] = (q.clone(), k.clone(), v.clone(), mask.clone(), scaling)

    probes, recorder = make(), Recorder()
    with torch.no_grad(), capture.capturing([*probes, recorder]):
        model(input_ids=input_ids, attention_mask=attention_mask)
    by_hand = make()
    for layer, (q, k, v, mask, scaling) in recorder.seen.items():
        feed(by_hand, layer, q, k, v, mask, scaling)
    for probe, reference in zip(probes, by_hand):
        _frames_close(probe.result(), reference.result())
    assert (probes[0].result()["samples"] == 2 * 8).all()  # every column of V of both sequences
    assert (probes[1].result()["samples"] == 24 + 17).all()  # the valid query rows
