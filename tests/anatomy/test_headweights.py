"""A run's per-key/value-head weights against pandas/numpy formulas written here, and its refusals in one line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from spectra.anatomy import headweights
from spectra.errors import SpectraError


def fake_run(folder, layers: int = 2, heads: int = 6, kv_heads: int = 2, seed: int = 0):
    """A run directory with metrics.csv (entropy_mean, rank90_mean per layer and head) and run.json."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame([{"layer": layer, "head": head, "entropy_mean": rng.uniform(0.5, 4.0),
                           "rank90_mean": rng.uniform(2, 60)} for layer in range(layers) for head in range(heads)])
    table.to_csv(folder / "metrics.csv", index=False)
    (folder / "run.json").write_text(json.dumps({"model": {"heads": heads, "kv_heads": kv_heads}}))
    return folder, table


def test_weights_are_the_group_means_of_the_measure(tmp_path) -> None:
    folder, table = fake_run(tmp_path / "run")
    entropy = np.exp(table["entropy_mean"].to_numpy()).reshape(2, 2, 3).mean(-1)
    np.testing.assert_allclose(headweights.read(str(folder)), entropy, rtol=1e-12)
    rank = table["rank90_mean"].to_numpy().reshape(2, 2, 3).mean(-1)
    np.testing.assert_allclose(headweights.read(f"{folder}@rank"), rank, rtol=1e-12)


@pytest.mark.parametrize("suffix, message", [("@size", "unknown measure 'size'"), ("/nothing", "not a finished")])
def test_a_bad_run_is_one_line(tmp_path, suffix, message) -> None:
    folder, _ = fake_run(tmp_path / "run")
    with pytest.raises(SpectraError, match=message):
        headweights.check(f"{folder}{suffix}")
    (folder / "run.json").write_text(json.dumps({"model": {"heads": 9, "kv_heads": 3}}))
    with pytest.raises(SpectraError, match="every one of the model's 9 heads"):
        headweights.check(str(folder))
