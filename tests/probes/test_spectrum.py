"""`spectra analyze`'s probe fed captured records: per-(layer, head) moments of the curve, σ and the metrics
against scipy in float64, padding read off the record, its tables and arrays, and its state."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from references import eager_ranks, poisson_replicates, spectrum_reference

import spectra
from spectra.capture import Captured
from spectra.errors import InternalError
from spectra.probes.offload import Offloaded
from spectra.probes.spectrum import SpectrumProbe
from spectra.seeds import Domain, derive_seed
from spectra.spectrum import METRICS
from spectra.stats import plain

pytestmark = pytest.mark.usefixtures("one_thread")


def record(layer: int, logits: torch.Tensor, mask: torch.Tensor | None = None, first: int = 0) -> Captured:
    """A captured layer whose P is softmax(logits + mask): q = logits, k = I, scale 1 make q kᵀ · scale = logits;
    its sequences are the run's `first`, `first` + 1, …"""
    batch, heads, n, _ = logits.shape
    eye = torch.eye(n).expand(batch, heads, n, n)
    return Captured.of(layer, logits, eye, torch.zeros_like(logits), mask, scaling=1.0,
                       index=tuple(range(first, first + batch)))


def padded(lengths: list[int], n: int) -> torch.Tensor:
    mask = torch.zeros(len(lengths), 1, n, n)
    for b, m in enumerate(lengths):
        mask[b, ..., m:] = torch.finfo(torch.float32).min
    return mask


def test_probe_streams_layers_heads_and_padding() -> None:
    """Probe averages over sequences per (layer, head), reading lengths off the record's valid keys."""
    n, heads, lengths = 20, 2, [20, 13]
    probe = SpectrumProbe(layers=2, heads=heads, n=n, at=5)
    mask = padded(lengths, n)
    logits = torch.randn(2, heads, n, n, generator=torch.Generator().manual_seed(1)) * 2
    p = torch.softmax(logits + mask, dim=-1)
    captured = record(1, logits, mask)
    assert torch.equal(captured.p, p) and captured.valid.sum(-1).tolist() == lengths
    probe.update(captured)
    for h in range(heads):
        refs = [spectrum_reference(p[b, h, : lengths[b], : lengths[b]].numpy(), 5, n) for b in range(2)]
        want = np.mean([r[0] for r in refs], axis=0)
        assert np.abs(probe.cum.mean[1, h] - want).max() < 1e-5
        want_rank = np.mean([r[1]["rank90"] for r in refs])
        assert probe.metrics.mean[1, h, METRICS.index("rank90")] == pytest.approx(want_rank)
    assert (probe.cum.count[0] == 0).all()


def test_tables_and_arrays() -> None:
    n, heads, lengths = 16, 2, [16, 11]
    probe = SpectrumProbe(layers=2, heads=heads, n=n, at=4)
    generator = torch.Generator().manual_seed(2)
    mask = padded(lengths, n)
    ps = {}
    for layer in range(2):
        for batch in range(2):  # two batches per layer
            logits = torch.randn(2, heads, n, n, generator=generator) * (1 + layer)
            ps.setdefault(layer, []).append(torch.softmax(logits + mask, dim=-1))
            probe.update(record(layer, logits, mask, first=2 * batch))
    tables, arrays = probe.tables(), probe.arrays()
    assert set(tables) == {"metrics.csv"} and set(arrays) == {"curves.npz"}
    metrics, curves = tables["metrics.csv"], arrays["curves.npz"]
    assert list(metrics.columns) == ["layer", "head", "sequences", *(f"{m}_{s}" for m in METRICS for s in ("mean", "std"))]
    assert metrics[["layer", "head"]].values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert (metrics["sequences"] == 4).all()
    assert set(curves) == {"index", "cum_mean", "cum_std", "sigma_mean", "sigma_std"}
    assert np.array_equal(curves["index"], np.arange(1, n + 1))
    assert curves["cum_mean"].shape == curves["sigma_mean"].shape == (2, heads, n)
    for layer in range(2):
        for h in range(heads):
            refs = [spectrum_reference(p[b, h, :m, :m].numpy(), 4, n) for p in ps[layer] for b, m in enumerate(lengths)]
            grids = np.array([r[0] for r in refs])
            assert np.abs(curves["cum_mean"][layer, h] - grids.mean(0)).max() < 1e-5
            assert np.abs(curves["cum_std"][layer, h] - grids.std(0)).max() < 1e-5
            sigma = np.zeros((len(refs), n))  # absolute index, zeros past each sequence's length
            blocks = [p[b, h, :m, :m] for p in ps[layer] for b, m in enumerate(lengths)]
            for i, block in enumerate(blocks):
                sigma[i, :len(block)] = scipy.linalg.svdvals(block.double().numpy())
            assert np.allclose(curves["sigma_mean"][layer, h], sigma.mean(0), atol=1e-6)
            row = metrics[(metrics["layer"] == layer) & (metrics["head"] == h)].iloc[0]
            for name in METRICS:
                values = np.array([r[1][name] for r in refs], dtype=float)
                assert row[f"{name}_mean"] == pytest.approx(values.mean(), rel=1e-4, abs=1e-6), name
                assert row[f"{name}_std"] == pytest.approx(values.std(), rel=1e-3, abs=1e-5), name


def test_state_resumes() -> None:
    n, lengths = 12, [12, 7]
    mask = padded(lengths, n)
    generator = torch.Generator().manual_seed(3)
    records = [record(layer, torch.randn(2, 2, n, n, generator=generator) * 2, mask, first=2 * (i // 2))
               for i, layer in enumerate((0, 1, 0, 1))]
    whole = SpectrumProbe(2, 2, n, 3)
    for captured in records:
        whole.update(captured)
    first = SpectrumProbe(2, 2, n, 3)
    for captured in records[:2]:
        first.update(captured)
    second = SpectrumProbe(2, 2, n, 3)
    second.load_state(plain(first.state()))
    for captured in records[2:]:
        second.update(captured)
    for name, part in whole.state().items():
        assert np.array_equal(part.array, second.state()[name].array), name


def test_bad_shapes() -> None:
    with pytest.raises(ValueError, match="at must be in 1…8"):
        SpectrumProbe(1, 2, 8, 9)
    probe = SpectrumProbe(1, 2, 8, 2)
    with pytest.raises(ValueError, match="expected P of 2 heads and n ≤ 8"):
        probe.update(record(0, torch.randn(1, 3, 8, 8)))
    with pytest.raises(ValueError, match="expected P of 2 heads and n ≤ 8"):
        probe.update(record(0, torch.randn(1, 2, 9, 9)))


def test_selected_layers_and_heads_only_and_their_bootstrap() -> None:
    """Only the chosen (layer, head) are measured, with the numbers of a full probe; the bootstrap replicates are
    the Poisson-weighted means recomputed here from each sequence's rank90, seeded by the global index.

    The numbers agree to rounding, not bitwise: the selection batches fewer matrices, so a matrix sits elsewhere
    in the batched Gram product and eigensolver, and MKL's kernels round differently at another memory alignment
    (a 9×9 float64 matrix at an odd position of a batch is 8 bytes off a 16-byte boundary; its eigenvalues then
    differ in the last bits). As with another batch size (tests/test_cli_reliability.py), c agrees to 1e-12; the
    ranks, integer counts, are equal."""
    n, lengths = 12, [12, 9]
    mask = padded(lengths, n)
    generator = torch.Generator().manual_seed(4)
    records = [record(layer, torch.randn(2, 3, n, n, generator=generator) * 2, mask, first=2 * (i // 3))
               for i, layer in enumerate((0, 1, 2, 0, 1, 2))]
    full = SpectrumProbe(3, 3, n, 4)
    part = SpectrumProbe(3, 3, n, 4, select_layers=[0, 2], select_heads=[1, 2], bootstrap=5, seed=7)
    for captured in records:
        full.update(captured)
        part.update(captured)
    table = part.tables()["metrics.csv"]
    assert table[["layer", "head"]].values.tolist() == [[0, 1], [0, 2], [2, 1], [2, 2]]
    both = full.tables()["metrics.csv"].merge(table, on=["layer", "head"], suffixes=("", "_part"))
    assert np.array_equal(both["rank90_mean"], both["rank90_mean_part"])
    curves = part.arrays()["curves.npz"]["cum_mean"]
    assert np.isnan(curves[1]).all() and np.isnan(curves[:, 0]).all()
    assert np.allclose(curves[2, 1:], full.arrays()["curves.npz"]["cum_mean"][2, 1:], rtol=0, atol=1e-12)
    replicates = part.arrays()["bootstrap.npz"]["replicates"]
    assert replicates.shape == (5, 3, 3, 2) and np.isnan(replicates[:, 1]).all()
    for layer in (0, 2):
        ranks = []  # per sequence (0…3), per selected head: rank90 from scipy
        for captured in (records[layer], records[layer + 3]):
            p = captured.p.double().numpy()
            for b, m in enumerate(lengths):
                ranks.append([spectrum_reference(p[b, h, :m, :m], 4, n)[1]["rank90"] for h in (1, 2)])
        weights = np.stack([np.random.default_rng(derive_seed(7, Domain.BOOTSTRAP, i)).poisson(1.0, 5)
                            for i in range(4)])  # (sequence, replicate)
        want = weights.T @ np.array(ranks, dtype=float) / weights.sum(0)[:, None]
        assert np.allclose(replicates[:, layer, 1:, 0], want)


# ---------------------------------------------------------------- the bootstrap is over sequences, not batch positions

QUIET = dict(progress=None, notify=lambda line: None)


def sequence_logits(count: int, heads: int = 2, n: int = 12) -> torch.Tensor:
    """Logits of `count` sequences (count, heads, n, n) at several temperatures, so their ranks differ."""
    generator = torch.Generator().manual_seed(6)
    scale = torch.logspace(-1, 1.3, count)[:, None, None, None]
    return torch.randn(count, heads, n, n, generator=generator) * scale


@pytest.mark.parametrize("wrap", ["plain", "inline", "overlapped"])
def test_bootstrap_weights_follow_each_sequence_whatever_its_batch(wrap) -> None:
    """Eight sequences in batches of 1, 3 or 8 (plain probe, or through the offloaded stage inline or on its worker
    thread): bitwise the same replicates, which are the Poisson-weighted means of each sequence's own rank90 and
    rank99 (scipy), sequence i weighted by draws seeded by its global index."""
    n, count, replicates = 12, 8, 40
    logits = sequence_logits(count, n=n)
    found = {}
    for size in (1, 3, 8):
        probe = SpectrumProbe(1, 2, n, 3, bootstrap=replicates, seed=5)
        fed = probe if wrap == "plain" else Offloaded(probe, "cpu", overlap=wrap == "overlapped")
        for start in range(0, count, size):
            fed.update(record(0, logits[start:start + size], first=start))
        found[size] = fed.arrays()["bootstrap.npz"]["replicates"]
        fed.close()
    assert np.array_equal(found[1], found[3]) and np.array_equal(found[1], found[8])
    p = torch.softmax(logits.double(), dim=-1).numpy()
    ranks = np.array([[[spectrum_reference(p[i, h], 3, n)[1][name] for name in ("rank90", "rank99")]
                       for h in range(2)] for i in range(count)], dtype=float)  # (sequence, head, metric)
    assert len(np.unique(ranks[:, 0, 0])) > 2, "the ranks must differ between sequences for the test to bite"
    want = poisson_replicates(ranks, replicates, seed=5)
    assert np.allclose(found[3][:, 0], want, rtol=1e-12, atol=0)


def test_a_record_without_its_sequence_indices_is_a_bug() -> None:
    """No fallback to batch positions: a record without indices, or with the wrong number, raises."""
    logits = sequence_logits(2)
    anonymous = Captured.of(0, logits, torch.eye(12).expand(2, 2, 12, 12), torch.zeros_like(logits), scaling=1.0)
    for probe in (SpectrumProbe(1, 2, 12, 3, bootstrap=4), Offloaded(SpectrumProbe(1, 2, 12, 3), "cpu")):
        with pytest.raises(InternalError, match="no sequence indices"):
            probe.update(anonymous)
    with pytest.raises(InternalError, match="1 sequence indices for a batch of 2"):
        SpectrumProbe(1, 2, 12, 3).add(0, anonymous.p, anonymous.valid, [0])


@pytest.fixture(scope="module")
def bootstrap_runs(roberta_dir, text_file, tmp_path_factory) -> dict:
    """The same 8 sequences analysed with --bootstrap 40 at batch sizes 1, 3 and 8."""
    root = tmp_path_factory.mktemp("bootstrap")
    return {size: spectra.analyze(str(roberta_dir), str(text_file), length=32, samples=8, batch_size=size,
                                  bootstrap=40, out=root / f"b{size}", **QUIET) for size in (1, 3, 8)}


def replicates_of(run) -> np.ndarray:
    with np.load(run.path / "bootstrap.npz", allow_pickle=False) as arrays:
        assert list(arrays["metrics"]) == ["rank90", "rank99"]
        return arrays["replicates"]


def test_bootstrap_replicates_do_not_depend_on_the_batch_size(bootstrap_runs) -> None:
    found = {size: replicates_of(run) for size, run in bootstrap_runs.items()}
    assert found[1].shape == (40, 2, 4, 2) and np.isfinite(found[1]).all()
    assert np.array_equal(found[1], found[3]) and np.array_equal(found[1], found[8])


def test_bootstrap_replicates_are_a_bootstrap_over_sequences(bootstrap_runs, roberta_dir, text_file) -> None:
    """Recomputed independently: each sequence alone through eager attention, its ranks from scipy, weighted by the
    Poisson draws seeded by its global index."""
    ranks = eager_ranks(roberta_dir, text_file, 32, 8)  # (sequence, layer, head, metric)
    assert (ranks[..., 0].std(0) > 0).any(), "the ranks must differ between sequences for the test to bite"
    want = poisson_replicates(ranks, 40)
    assert np.allclose(replicates_of(bootstrap_runs[3]), want, rtol=1e-12, atol=0)
    run = bootstrap_runs[3].metrics.set_index(["layer", "head"])
    assert np.allclose(run["rank90_mean"].to_numpy().reshape(2, 4), ranks[..., 0].mean(0), rtol=1e-12)
