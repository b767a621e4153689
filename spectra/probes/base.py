"""The probe protocol with no-op defaults, and `Probes`, several probes run as one (see the package docstring)."""


from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..capture import Captured
from ..stats import State

if TYPE_CHECKING:
    from ..kv.presses import Prefill


class Probe:
    """The probe protocol with no-op defaults (see the package docstring). A probe has two typed inputs, one per
    kind of pass a source runs: `update(captured)`, a layer of a model's forward pass (`capture.Captured`), and
    `prefilled(prefill)`, a layer of an example's exact prefill (`presses.Prefill`, what the task protocol's source
    computes for the presses); a probe overrides the one its source feeds."""

    def update(self, captured: Captured) -> None:
        pass

    def prefilled(self, prefill: Prefill) -> None:
        pass

    def after_batch(self, batch: Any) -> None:
        pass

    def ready(self) -> bool:
        """Whether the state may be checkpointed now (a probe in the middle of a calibration may not be)."""
        return True

    def state(self) -> State:
        return {}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        pass

    def tables(self) -> dict[str, pd.DataFrame]:
        return {}

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class Probes(Probe):
    """Several probes fed together; state names are prefixed with each probe's name and '/'."""

    def __init__(self, **probes: Probe) -> None:
        self.probes = probes

    def update(self, captured: Captured) -> None:
        for probe in self.probes.values():
            probe.update(captured)

    def prefilled(self, prefill: Prefill) -> None:
        for probe in self.probes.values():
            probe.prefilled(prefill)

    def after_batch(self, batch: Any) -> None:
        for probe in self.probes.values():
            probe.after_batch(batch)

    def ready(self) -> bool:
        return all(probe.ready() for probe in self.probes.values())

    def state(self) -> State:
        return {f"{name}/{key}": part for name, probe in self.probes.items() for key, part in probe.state().items()}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, probe in self.probes.items():
            prefix = f"{name}/"
            probe.load_state({key[len(prefix):]: value for key, value in arrays.items() if key.startswith(prefix)})

    def tables(self) -> dict[str, pd.DataFrame]:
        return _merged(probe.tables() for probe in self.probes.values())

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        return _merged(probe.arrays() for probe in self.probes.values())

    def describe(self) -> dict[str, Any]:
        return _merged(probe.describe() for probe in self.probes.values())

    def close(self) -> None:
        """Close every probe, even when one fails; the first failure is raised."""
        failure = None
        for probe in self.probes.values():
            try:
                probe.close()
            except BaseException as error:  # noqa: BLE001 - re-raised below
                failure = failure or error
        if failure is not None:
            raise failure


def _merged(parts) -> dict:
    merged: dict = {}
    for part in parts:
        clash = set(merged) & set(part)
        if clash:
            raise ValueError(f"two probes produce {sorted(clash)}")
        merged.update(part)
    return merged
