"""The Theorem 1/2 probes (padding, seeds, tables, the record's scale, devices, inside a model forward) and
`spectra theorems`: the run on a captured model against eager attention, pooling, synthetic mode, bad input."""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from frames import assert_frames_close
from layers import attention_probs, padding_mask, softmax
from transformers import AutoModel, AutoTokenizer

from spectra import capture, cli, data
from spectra.api import theorems
from spectra.capture import Captured
from spectra.errors import SpectraError
from spectra.nn.linformer import linear_attention
from spectra.nn.projections import Projections
from spectra.probes import Probe, Probes
from spectra.probes.theorems import Theorem1Probe, Theorem2Probe
from spectra.sources import gaussian_qkv
from spectra.stats import plain
from spectra.theory.bounds import jl_failure_bound, theorem1_bound, theorem1_k, theorem2_k
from spectra.theory.errors import theorem1_errors

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
QUIET = dict(progress=None, notify=lambda line: None)
N = 24

pytestmark = pytest.mark.usefixtures("one_thread")


def feed(probes, layer: int, q, k, v, mask=None, scaling=None, index=None) -> Captured:
    """One captured layer of the given tensors handed to each probe (`index`: the sequences' global indices, which
    seed their random projections; default 0…B−1, a run's first batch); returns the record."""
    record = Captured.of(layer, q, k, v, mask, scaling, index=tuple(range(q.shape[0]) if index is None else index))
    for probe in probes:
        probe.update(record)
    return record


def test_theorem1_probe_against_the_lemma_on_synthetic_vectors() -> None:
    """P = 1 xᵀ and V = xᵀ make the probe's error |‖Rx‖² − ‖x‖²| / ‖x‖², the lemma's x = y case; one R per layer.

    P = 1 xᵀ is captured as q = 1, k = z (d = 1, scale 1): every row of q kᵀ is z, so every row of P is softmax(z) = x.
    """
    n, layers = 64, 300
    z = torch.from_numpy(np.random.default_rng(1).standard_normal(n)).float()
    x = torch.softmax(z, dim=0)
    p = x.expand(n, n)[None, None]
    v = x[None, None, :, None]
    ones, keys = torch.ones(1, 1, n, 1), z[None, None, :, None]
    assert torch.allclose(Captured.of(0, ones, keys, v, scaling=1.0).p, p, rtol=1e-6, atol=0)
    probe = Theorem1Probe(layers, 1, n, [32, 64], [0.3, 0.5], best_rank=False, seed=2, fixed=True)
    for layer in range(layers):
        probe.update(Captured.of(layer, ones, keys, v, scaling=1.0, index=(0,)))
    table = probe.result()
    assert (table["samples"] == 1).all()
    rates = table.groupby(["budget", "eps"])["pr"].mean()
    for (budget, eps), rate in rates.items():
        assert 1 - rate <= jl_failure_bound(eps, budget), (budget, eps, rate)
    direct = [abs((probe.r(layer, 64) @ x).square().sum() / x.square().sum() - 1).item() for layer in range(layers)]
    assert rates[(64, 0.5)] == pytest.approx(np.mean(np.array(direct) <= 0.5))


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
        feed([batched], layer, q, k, v, mask, index=(0, 1))
        feed([alone], layer, q[:1], k[:1], v[:1], index=(0,))
        feed([alone], layer, q[1:, :, :21], k[1:, :, :21], v[1:, :, :21], index=(1,))
    _frames_close(batched.result(), alone.result())
    samples = batched.result()["samples"]
    per_sequence = 4 if isinstance(batched, Theorem1Probe) else None  # columns of V, or valid query rows
    assert (samples == (2 * per_sequence if per_sequence else 32 + 21)).all()


def test_probes_are_deterministic_and_seeded() -> None:
    q, k, v = gaussian_qkv(32, 4, heads=2, batch=3, seed=0)

    def run(seed: int, batches: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        probes = [Theorem1Probe(1, 2, 32, [8], [0.5], seed=seed), Theorem2Probe(1, 2, 32, [8], [0.5], seed=seed)]
        for part in np.array_split(np.arange(3), batches):
            feed(probes, 0, q[part], k[part], v[part], index=part.tolist())
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
    probe = Theorem1Probe(1, 2, 32, [32, 8], [0.5, 0.2], seed=0, fixed=True)
    feed([probe], 0, q, k, v)
    p = attention_probs(q, k)
    table = probe.result()
    assert list(table.columns) == ["layer", "head", "budget", "method", "relative_to", "eps", "pr", "samples",
                                   "median", "p95", "mean", "max", "sequences", "pr_mean", "pr_low", "pr_high",
                                   "pr_draw_std", "n", "draws", "bound", "k_theory"]
    assert len(table) == 2 * 2 * 3 * 2 and (table["draws"] == 0).all()
    row = table[(table["head"] == 1) & (table["budget"] == 8) & (table["method"] == "jl") & (table["eps"] == 0.2)
                & (table["relative_to"] == "output")].iloc[0]
    errors = theorem1_errors(p, v, probe.r(0, 8))[:, 1].flatten().numpy()
    assert row["pr"] == pytest.approx((errors <= 0.2).mean())
    assert row["mean"] == pytest.approx(errors.mean(), rel=1e-5)
    assert row["median"] == pytest.approx(np.median(errors), rel=0.05)
    assert row["bound"] == theorem1_bound(0.2, 32, 8) and row["k_theory"] == theorem1_k(0.2, 32)
    exact = table[(table["budget"] == 32) & (table["method"] == "svd")]
    assert (exact["max"] < 1e-3).all() and (exact["pr"] == 1.0).all()


def test_theorem2_probe_table_and_architecture_rows() -> None:
    q, k, v = gaussian_qkv(32, 4, heads=2, batch=2, seed=4)
    probe = Theorem2Probe(1, 2, 32, [8], [0.5], seed=3, deltas=("1/2^n", 0.5), fixed=True)
    feed([probe], 0, q, k, v)
    table = probe.result()
    assert list(table.columns) == ["layer", "head", "budget", "method", "variant", "relative_to", "eps", "pr", "samples",
                                   "median", "p95", "mean", "max", "sequences", "pr_mean", "pr_low", "pr_high",
                                   "pr_draw_std", "n", "d", "draws", "delta", "k_theory"]
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


def test_probe_tables_pool_layers_and_heads() -> None:
    q, k, v = gaussian_qkv(16, 4, heads=2, batch=2, seed=1)
    probes = Probes(theorem1=Theorem1Probe(2, 2, 16, [4], [0.5]), theorem2=Theorem2Probe(2, 2, 16, [4], [0.5]))
    for layer in range(2):
        feed([probes], layer, q, k, v)
    tables = probes.tables()
    assert set(tables) == {f"theorem{i}{scope}.csv" for i in (1, 2) for scope in ("", "_layers", "_heads")}
    for name in ("theorem1", "theorem2"):
        pooled, layers, heads = (tables[f"{name}{scope}.csv"] for scope in ("", "_layers", "_heads"))
        assert "layer" not in pooled and "head" not in pooled and "head" not in layers and "layer" in layers
        assert pooled["samples"].sum() == layers["samples"].sum() == heads["samples"].sum()
        assert pooled["max"].max() == heads["max"].max()
    # a checkpointed state continues in a fresh probe
    fresh = Probes(theorem1=Theorem1Probe(2, 2, 16, [4], [0.5]), theorem2=Theorem2Probe(2, 2, 16, [4], [0.5]))
    fresh.load_state(plain(probes.state()))
    for name, table in fresh.tables().items():
        assert table.equals(tables[name]), name


def test_theorem2_probe_uses_the_records_scaling() -> None:
    """The probe scores with the record's scale (the model's own); errors with scale s match a dense computation
    with s (replaces the old check of a `scaling=` argument against P: the record carries the scale now)."""
    q, k, v = gaussian_qkv(16, 4, heads=1, seed=0)
    deltas, sharing = (0.5,), ("kv",)
    probes = {s: Theorem2Probe(1, 1, 16, [4], [0.5], seed=2, deltas=deltas, sharing=sharing, fixed=True)
              for s in (1.0, None)}
    for s, probe in probes.items():
        feed([probe], 0, q, k, v, scaling=s)
    table, default = probes[1.0].result(), probes[None].result()
    assert not np.allclose(table["mean"], default["mean"])  # the scale matters

    def dense(rows: np.ndarray, e: np.ndarray, f: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
        """Per row w of A = q kᵀ·scale: ‖softmax(w Eᵀ) F V − softmax(w) V‖ over ‖softmax(w)‖ ‖V‖_F and ‖softmax(w) V‖."""
        a = rows @ k[0, 0].double().numpy().T * scale
        vv = v[0, 0].double().numpy()
        exact = softmax(a) @ vv
        err = np.linalg.norm(softmax(a @ e.T) @ (f @ vv) - exact, axis=-1)
        return err / (np.linalg.norm(softmax(a), axis=-1) * np.linalg.norm(vv)), err / np.linalg.norm(exact, axis=-1)

    rows = q[0, 0].double().numpy()
    r = probes[1.0].r(0, 4).double().numpy()
    rhs, out = dense(rows, 0.5 * r, math.exp(-0.5) * r, 1.0)
    e, f = (m[0].detach().double().numpy() for m in Projections(1, 1, 4, 16, "kv", seed=2).pair(0))
    _, linformer = dense(rows, e, f, 1.0)
    for variant, relative_to, errors in [("delta=0.5", "rhs", rhs), ("delta=0.5", "output", out),
                                         ("kv", "output", linformer)]:
        row = table[(table["variant"] == variant) & (table["relative_to"] == relative_to)].iloc[0]
        assert row["mean"] == pytest.approx(errors.mean(), rel=1e-4), (variant, relative_to)
        assert row["max"] == pytest.approx(errors.max(), rel=1e-4), (variant, relative_to)


def test_bad_input_is_one_line() -> None:
    cases = [
        (lambda: Theorem1Probe(1, 1, 32, [0, 8], [0.5]), "positive integer"),
        (lambda: Theorem1Probe(1, 1, 32, [64], [0.5]), "exceeds"),
        (lambda: Theorem1Probe(1, 1, 32, [], [0.5]), "list of budgets is empty"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [0.0]), "strictly between 0 and 1"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [1.0]), "strictly between 0 and 1"),
        (lambda: Theorem1Probe(1, 1, 32, [8], [1.5]), "strictly between 0 and 1"),
        (lambda: Theorem1Probe(1, 1, 32, [8], []), "ε list is empty"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [0.5], deltas=("1/n^2",)), "unknown delta"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [0.5], sharing=("rows",)), "unknown sharing"),
        (lambda: Theorem2Probe(1, 1, 32, [8], [0.5], deltas=(), sharing=()), "nothing to measure"),
    ]
    for make, message in cases:
        with pytest.raises(SpectraError, match=message) as error:
            make()
        assert "\n" not in str(error.value)
    probe = Theorem1Probe(2, 2, 16, [4], [0.5])
    q, k, v = gaussian_qkv(20, 4, heads=2, seed=0)
    with pytest.raises(SpectraError, match="sequences of ≤ 16 tokens"):
        feed([probe], 0, q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_probes_run_on_the_tensors_device(device) -> None:
    q, k, v = (t.to(device) for t in gaussian_qkv(16, 4, heads=2, batch=2, seed=0))
    mask = padding_mask([16, 9], 16).to(device)
    probes = [Theorem1Probe(1, 2, 16, [4, 8], [0.5]), Theorem2Probe(1, 2, 16, [4], [0.5])]
    feed(probes, 0, q, k, v, mask)
    on_cpu = [Theorem1Probe(1, 2, 16, [4, 8], [0.5]), Theorem2Probe(1, 2, 16, [4], [0.5])]
    feed(on_cpu, 0, q.cpu(), k.cpu(), v.cpu(), mask.cpu())
    for probe, reference in zip(probes, on_cpu):
        _frames_close(probe.result(), reference.result())


def test_probes_inside_a_model_forward() -> None:
    """The probes run under the capture attention (padded batch) and match feeding the same q, k, v by hand."""
    from transformers import BertConfig

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=24)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation=capture.NAME).eval()
    input_ids = torch.randint(5, 50, (2, 24))
    attention_mask = torch.ones(2, 24, dtype=torch.long)
    attention_mask[1, 17:] = 0

    def make() -> list:
        return [Theorem1Probe(2, 2, 24, [4, 12], [0.3, 0.5]), Theorem2Probe(2, 2, 24, [4, 12], [0.3, 0.5])]

    class Recorder(Probe):
        def __init__(self) -> None:
            self.seen: dict[int, tuple] = {}

        def update(self, captured: Captured) -> None:
            self.seen[captured.layer] = (captured.q.clone(), captured.k.clone(), captured.v.clone(),
                                         captured.mask.clone(), captured.scaling)

    probes, recorder = make(), Recorder()
    observe = Probes(theorem1=probes[0], theorem2=probes[1], recorder=recorder)
    with torch.no_grad(), capture.capturing(observe.update, index=(0, 1)):
        model(input_ids=input_ids, attention_mask=attention_mask)
    assert sorted(recorder.seen) == [0, 1]
    by_hand = make()
    for layer, (q, k, v, mask, scaling) in recorder.seen.items():
        feed(by_hand, layer, q, k, v, mask, scaling)
    for probe, reference in zip(probes, by_hand):
        _frames_close(probe.result(), reference.result())
    assert (probes[0].result()["samples"] == 2 * 8).all()  # every column of V of both sequences
    assert (probes[1].result()["samples"] == 24 + 17).all()  # the valid query rows


# ---------------------------------------------------------------- spectra theorems: the whole run


def test_theorem1_on_a_model_matches_eager_attention(roberta_dir, text_file, tmp_path) -> None:
    run = theorems(str(roberta_dir), str(text_file), budget=[4, 8], eps=[0.3, 0.5], length=N, samples=4,
                   batch_size=2, out=tmp_path / "run", **QUIET)
    model = AutoModel.from_pretrained(roberta_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(roberta_dir)
    corpus = data.open_corpus(str(text_file), seed=0)
    probe = Theorem1Probe(2, 4, N, [4, 8], [0.3, 0.5])  # draws R exactly as the run's probe: per sequence
    errors = {(layer, budget): [] for layer in range(2) for budget in (4, 8)}
    entries = {(layer, budget): [] for layer in range(2) for budget in (4, 8)}
    with torch.no_grad():
        for batch in data.batches(tokenizer, corpus, N, "pack", 4, 2):
            out = model(input_ids=batch.input_ids, output_attentions=True, output_hidden_states=True)
            for layer in range(2):
                hidden = out.hidden_states[layer]
                v = model.encoder.layer[layer].attention.self.value(hidden).view(*hidden.shape[:2], 4, -1)
                p, v = out.attentions[layer].double().numpy(), v.transpose(1, 2).double().numpy()
                for budget in (4, 8):
                    for b, sequence in enumerate(batch.index):
                        r = probe.r(layer, budget, sequence=sequence).double().numpy()
                        approx = p[b] @ r.T @ r @ v[b]
                        exact = p[b] @ v[b]
                        errors[(layer, budget)] += list((np.linalg.norm(approx - exact, axis=-2)
                                                         / np.linalg.norm(exact, axis=-2)).ravel())
                        scale = np.linalg.norm(p[b], axis=-1)[..., None] * np.linalg.norm(v[b], axis=-2)[:, None]
                        entries[(layer, budget)] += list((np.abs(approx - exact) / scale).max(-2).ravel())
    layers = run.tables["theorem1_layers"]
    for form, measured in (("output", errors), ("rows", entries)):
        for (layer, budget), values in measured.items():
            for eps in (0.3, 0.5):
                row = layers[(layers.layer == layer) & (layers.budget == budget) & (layers.method == "jl")
                             & (layers.eps == eps) & (layers.relative_to == form)].iloc[0]
                assert row["samples"] == len(values)
                assert row["pr"] == pytest.approx(np.mean(np.array(values) <= eps), abs=1e-9), form
                assert row["mean"] == pytest.approx(np.mean(values), rel=1e-4), form
                assert row["sequences"] == 4 and row["pr_low"] <= row["pr_mean"] <= row["pr_high"]
    pooled = run.tables["theorem1"]
    heads = run.tables["theorem1_heads"]
    for (budget, method, form, eps), group in heads.groupby(["budget", "method", "relative_to", "eps"]):
        row = pooled[(pooled.budget == budget) & (pooled.method == method) & (pooled.relative_to == form)
                     & (pooled.eps == eps)].iloc[0]
        assert row["samples"] == group["samples"].sum()
        assert row["pr"] == pytest.approx(np.average(group["pr"], weights=group["samples"]))
        assert row["max"] == group["max"].max()


def test_synthetic_run_and_cli(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "theorems", "--synthetic", "--length", "32", "--d", "8", "--budget", "4,16",
                                      "--eps", "0.5", "--samples", "3"])
    cli.main()
    out = capsys.readouterr().out
    assert "Theorem 1, P̃ = P RᵀR" in out and "ε=0.5" in out and "svd" in out
    run_dir = tmp_path / "runs" / "synthetic-n32-d8-theorems"
    assert (run_dir / "theorem2_heads.csv").exists()
    two = pd.read_csv(run_dir / "theorem2.csv")
    assert set(two["variant"]) >= {"delta=1/2^n", "delta=1/n", "kv", "layerwise"}
    assert (two["samples"] == 3 * 32).all()


@pytest.mark.parametrize("args, message", [
    (["--budget", "0"], "budget 0 is not a positive integer"),
    (["--budget", "64"], "budget 64 exceeds the sequence length n = 32; use budgets ≤ 32"),
    (["--budget", ""], "the list of budgets is empty"),
    (["--eps", "1.5"], "ε must lie strictly between 0 and 1"),
    (["--eps", "x"], "--eps 'x' is not a comma-separated list of numbers"),
])
def test_bad_input(args, message, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spectra", "theorems", "--synthetic", "--length", "32", "--samples", "1", "--budget", "4", *args])
    with pytest.raises(SystemExit) as done:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and "\n" not in err and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_interval_covers_the_true_probability(one_thread) -> None:
    """A case whose Pr is known exactly: P = 1 xᵀ and V = x make each error |‖Rx‖² − ‖x‖²| / ‖x‖², distributed as
    |χ²_k/k − 1| whatever x; three heads share each sequence's R, so their errors are correlated within a sequence.
    The 95% interval over 40 sequences must cover the true Pr in at least 90 of 100 seeded repetitions."""
    from scipy.stats import chi2

    n, budget, eps, heads, sequences = 24, 16, 0.35, 3, 40
    truth = chi2.cdf(budget * (1 + eps), budget) - chi2.cdf(budget * (1 - eps), budget)
    covered, widths = 0, []
    for repetition in range(100):
        probe = Theorem1Probe(1, heads, n, [budget], [eps], best_rank=False, seed=repetition)
        g = torch.Generator().manual_seed(repetition)
        z = torch.randn(sequences, heads, 1, n, generator=g, dtype=torch.float64)
        x = torch.softmax(z, dim=-1)
        q = torch.ones(sequences, heads, n, 1, dtype=torch.float64)
        k = z.transpose(-1, -2)
        feed([probe], 0, q, k, x.transpose(-1, -2), scaling=1.0, index=range(sequences))
        row = probe.result(pool=("layer", "head"))
        row = row[row["relative_to"] == "output"].iloc[0]
        covered += row["pr_low"] <= truth <= row["pr_high"]
        widths.append(row["pr_high"] - row["pr_low"])
    assert covered >= 90, (covered, truth)
    assert 0.05 < np.mean(widths) < 0.5, "an interval that is neither degenerate nor trivial"


def test_draws_give_a_spread_and_fixed_gives_one_draw() -> None:
    q, k, v = gaussian_qkv(16, 4, heads=2, batch=3, seed=2)
    several = Theorem1Probe(1, 2, 16, [4], [0.5], draws=4)
    fixed = Theorem1Probe(1, 2, 16, [4], [0.5], fixed=True)
    feed([several, fixed], 0, q, k, v, index=(5, 6, 7))
    table, once = several.result(), fixed.result()
    jl = table[table["method"] == "jl"]
    assert (jl["samples"] == 4 * 3 * 4).all() and (jl["draws"] == 4).all()
    assert np.isfinite(jl["pr_draw_std"]).all() and once["pr_draw_std"].isna().all()
    svd = table[table["method"] == "svd"]
    assert (svd["samples"] == 3 * 4).all(), "the truncated SVD draws nothing: each sample counts once"
    with pytest.raises(SpectraError, match="--draws must be a positive integer"):
        Theorem1Probe(1, 2, 16, [4], [0.5], draws=0)


def test_per_sequence_draws_do_not_depend_on_the_batching(roberta_dir, text_file, tmp_path) -> None:
    """Each sequence's R is seeded by its global index: batches of 1 and of 3 give the same tables."""
    common = dict(budget=[4, 8], eps=[0.3, 0.5], draws=2, length=16, samples=5, progress=None,
                  notify=lambda line: None)
    one = theorems(str(roberta_dir), str(text_file), batch_size=1, out=tmp_path / "one", **common)
    three = theorems(str(roberta_dir), str(text_file), batch_size=3, out=tmp_path / "three", **common)
    for name, table in one.tables.items():
        assert_frames_close(three.tables[name], table, rtol=1e-6, atol=1e-9, name=name)
