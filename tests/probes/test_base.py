"""The probe protocol's defaults and `Probes`, several probes run as one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectra.probes import Probe, Probes
from spectra.stats import Reduce, Tagged, plain


class Counter(Probe):
    """Counts layers and batches; its state is one summed array and one maximum."""

    def __init__(self, name: str, fail_on_close: bool = False) -> None:
        self.name, self.fail_on_close, self.closed = name, fail_on_close, False
        self.layers, self.batches, self.peak = np.zeros(1), np.zeros(1), np.zeros(1)

    def update(self, captured) -> None:
        self.layers += 1
        self.peak = np.maximum(self.peak, captured)

    def after_batch(self, batch) -> None:
        self.batches += 1

    def state(self):
        return {"layers": Tagged(self.layers), "batches": Tagged(self.batches), "peak": Tagged(self.peak, Reduce.MAX)}

    def load_state(self, arrays) -> None:
        self.layers, self.batches, self.peak = (np.array(arrays[key]) for key in ("layers", "batches", "peak"))

    def tables(self):
        return {f"{self.name}.csv": pd.DataFrame({"layers": self.layers})}

    def close(self) -> None:
        self.closed = True
        if self.fail_on_close:
            raise RuntimeError(f"{self.name} failed to close")


def test_defaults_are_no_ops() -> None:
    probe = Probe()
    probe.update(None)
    probe.prefilled(None)
    probe.after_batch(None)
    probe.load_state({})
    probe.close()
    assert probe.state() == {} and probe.tables() == {} and probe.arrays() == {} and probe.describe() == {}


def test_probes_fan_out_and_namespace_their_states() -> None:
    a, b = Counter("a"), Counter("b")
    both = Probes(first=a, second=b)
    for value in (3.0, 5.0):
        both.update(value)
    both.after_batch(None)
    state = both.state()
    assert sorted(state) == ["first/batches", "first/layers", "first/peak", "second/batches", "second/layers",
                             "second/peak"]
    assert state["first/peak"].reduce is Reduce.MAX and state["second/layers"].reduce is Reduce.SUM
    fresh = Probes(first=Counter("a"), second=Counter("b"))
    fresh.load_state(plain(state))
    assert fresh.probes["first"].layers[0] == 2 and fresh.probes["second"].peak[0] == 5
    assert sorted(both.tables()) == ["a.csv", "b.csv"]
    with pytest.raises(ValueError, match="two probes produce"):
        Probes(x=Counter("same"), y=Counter("same")).tables()


def test_close_closes_every_probe_and_raises_the_first_failure() -> None:
    bad, good = Counter("bad", fail_on_close=True), Counter("good")
    with pytest.raises(RuntimeError, match="bad failed to close"):
        Probes(bad=bad, good=good).close()
    assert bad.closed and good.closed


def test_several_probes_get_each_input_they_are_fed() -> None:
    """Issue 37, item 1: the probe contract has two typed inputs, a forward pass's layer (`update`) and an exact
    prefill's layer (`prefilled`); several probes run as one get each."""

    class Keep(Probe):
        def __init__(self) -> None:
            self.seen: list[tuple[str, object]] = []

        def update(self, captured) -> None:
            self.seen.append(("update", captured))

        def prefilled(self, prefill) -> None:
            self.seen.append(("prefilled", prefill))

    one, two = Keep(), Keep()
    both = Probes(one=one, two=two)
    both.update("layer 0")
    both.prefilled("prefill 0")
    assert one.seen == two.seen == [("update", "layer 0"), ("prefilled", "prefill 0")]
