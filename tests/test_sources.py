"""Gaussian q, k, v: seeded draws, and the synthetic source's batches (resumed and sharded)."""

from __future__ import annotations

import pytest
import torch

from spectra.capture import Captured
from spectra.config import RunConfig
from spectra.errors import SpectraError
from spectra.probes import Probe
from spectra.sources import SyntheticSource, gaussian_qkv


class Collect(Probe):
    """A probe that keeps every record a source hands its `update`."""

    def __init__(self, records: list[Captured]) -> None:
        self.records = records

    def update(self, captured: Captured) -> None:
        self.records.append(captured)


def test_gaussian_qkv_is_seeded() -> None:
    q, k, v = gaussian_qkv(8, 4, heads=3, batch=2, seed=1)
    assert q.shape == k.shape == v.shape == (2, 3, 8, 4)
    assert torch.equal(q, gaussian_qkv(8, 4, heads=3, batch=2, seed=1)[0])
    assert not torch.equal(q, gaussian_qkv(8, 4, heads=3, batch=2, seed=2)[0])
    assert not torch.equal(q, k)
    assert gaussian_qkv(8, 4, dtype=torch.float64)[0].dtype == torch.float64
    with pytest.raises(SpectraError, match="must be ≥ 1"):
        gaussian_qkv(0, 4)


def source(samples: int = 10, batch_size: int = 4) -> SyntheticSource:
    return SyntheticSource(RunConfig(length=8, samples=samples, batch_size=batch_size, seed=3), 4, 2, "cpu")


def test_batches_are_whole_from_skip() -> None:
    synthetic = source()
    assert [(b.start, b.size) for b in synthetic.batches(10)] == [(0, 4), (4, 4), (8, 2)]
    assert [(b.start, b.size) for b in synthetic.batches(10, skip=4)] == [(4, 4), (8, 2)]  # resumed after one batch
    assert list(synthetic.batches(10, skip=12)) == []
    assert next(iter(synthetic.batches(10, skip=4))).index == [4, 5, 6, 7]
    # samples a checkpoint shard holds are left out; the rest batched as they come, across processes by batch
    assert [b.index for b in synthetic.batches(10, skip=2, held={3, 4, 8})] == [[2, 5, 6, 7], [9]]
    assert [b.index for b in synthetic.batches(10, skip=2, held={3, 4, 8}, shard=(1, 2))] == [[9]]


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("skip", [0, 3])
def test_shards_are_round_robin_and_cover_every_sample_once(size, skip) -> None:
    synthetic = source(batch_size=3)
    seen = []
    for rank in range(size):
        batches = list(synthetic.batches(10, skip=skip, shard=(rank, size)))
        starts = list(range(skip, 10, 3))
        assert [b.start for b in batches] == starts[rank::size]  # batch b goes to process b mod size
        seen += [i for batch in batches for i in batch.index]
    assert sorted(seen) == list(range(skip, 10))


def test_run_hands_one_seeded_layer() -> None:
    synthetic = source()
    records: list[Captured] = []
    batch = next(iter(synthetic.batches(10, skip=4)))
    synthetic.run(batch, Collect(records))
    synthetic.run(batch, Collect(records))
    first, again = records
    assert first.layer == 0 and first.q.shape == first.k.shape == first.v.shape == (4, 2, 8, 4)
    assert first.valid.all() and first.scaling == 4**-0.5 and not first.causal
    assert torch.equal(first.q, again.q) and torch.equal(first.v, again.v)
    other: list[Captured] = []
    synthetic.run(next(iter(synthetic.batches(10))), Collect(other))
    assert not torch.equal(first.q, other[0].q)
