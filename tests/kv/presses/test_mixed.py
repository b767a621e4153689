"""`mixed(RUN)` against the presses it names: each key/value head holds exactly the rows, positions and bytes its own
press gave it, padded and hidden to the longest head; the map is read and refused in one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from spectra import registry
from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY
from spectra.kv.presses.base import full_memory

from .conftest import make_prefill


def write_map(folder, plan: dict[float, list[tuple[str, float]]], layers: int = 1) -> str:
    """A cache_axes.csv whose best rows are `plan` (budget → per key/value head (press, ratio)), with a losing row
    beside each."""
    rows = []
    for budget, heads in plan.items():
        for layer in range(layers):
            for head, (press, ratio) in enumerate(heads):
                rows.append({"budget": budget, "layer": layer, "kv_head": head, "axis": "x", "press": press,
                             "ratio": ratio, "bytes_share": 0.1, "out_err": 0.1, "best": True})
                rows.append({"budget": budget, "layer": layer, "kv_head": head, "axis": "y", "press": "random",
                             "ratio": 0.9, "bytes_share": 0.1, "out_err": 0.9, "best": False})
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "cache_axes.csv", index=False)
    return str(folder)


def test_each_head_holds_what_its_own_press_left_it(tmp_path) -> None:
    run = write_map(tmp_path / "run", {0.6: [("knorm", 0.5), ("kivi4", 0.5)], 0.3: [("think", 0.9), ("snapkv", 0.7)]})
    press = REGISTRY[f"mixed({run})"]
    prefill, _ = make_prefill(length=300)
    for ratio, chosen in ((0.4, [("knorm", 0.5), ("kivi4", 0.5)]), (0.7, [("think", 0.9), ("snapkv", 0.7)])):
        got = press.compress(prefill, ratio)
        keys, values = got.rows(prefill.key, prefill.value)
        stored = []
        for head, (name, inner_ratio) in enumerate(chosen):
            own = REGISTRY[name].compress(prefill, inner_ratio)
            own_keys, own_values = own.rows(prefill.key, prefill.value)
            count = int(own.counts()[head])
            assert int(got.counts()[head]) == count
            np.testing.assert_array_equal(got.kept[head, :count].numpy(), own.kept[head, :count].numpy())
            np.testing.assert_array_equal(keys[head, :count].numpy(), own_keys[head, :count].numpy())
            np.testing.assert_array_equal(values[head, :count].numpy(), own_values[head, :count].numpy())
            stored.append(int(own.memory(prefill)[head]))
        assert got.memory(prefill).tolist() == stored
        assert got.saved == pytest.approx(1 - sum(stored) / (2 * full_memory(prefill)))
        assert got.valid is not None and got.kept.shape[-1] == max(int(c) for c in got.counts())
    knorm_head = press.compress(prefill, 0.4)
    assert knorm_head.counts().tolist() == [150, 300] and not knorm_head.valid[0, 150:].any()


def test_the_map_and_the_ratio_are_checked_in_one_line(tmp_path) -> None:
    with pytest.raises(SpectraError, match="reads the axis map .*nowhere, which does not exist: give a spectra cache "
                                           "run made with --bytes-kept"):
        registry.PRESSES.resolve(f"mixed({tmp_path / 'nowhere'})")
    (tmp_path / "bad").mkdir()
    pd.DataFrame({"budget": [0.5]}).to_csv(tmp_path / "bad" / "cache_axes.csv", index=False)
    with pytest.raises(SpectraError, match="no axis map .* no column layer, kv_head, press, ratio, best"):
        registry.PRESSES.resolve(f"mixed({tmp_path / 'bad'})")
    observed = write_map(tmp_path / "observed", {0.5: [("observed", 0.5), ("knorm", 0.5)]})
    with pytest.raises(SpectraError, match="presses reading a prefill pass .*: observed"):
        registry.PRESSES.resolve(f"mixed({observed})")
    kvzip = write_map(tmp_path / "kvzip", {0.5: [("knorm", 0.5), ("kvzip", 0.5)]})
    with pytest.raises(SpectraError, match="prefill pass .*, which it does not prefill: kvzip"):
        registry.PRESSES.resolve(f"mixed({kvzip})")
    queries = write_map(tmp_path / "queries", {0.5: [("knorm", 0.5), ("expected_attention", 0.5)]})
    with pytest.raises(SpectraError, match="prefill pass .*: expected_attention"):  # its queries were never kept
        registry.PRESSES.resolve(f"mixed({queries})")
    run = write_map(tmp_path / "run", {0.6: [("knorm", 0.5), ("kivi4", 0.5)]})
    press = REGISTRY[f"mixed({run})"]
    prefill, _ = make_prefill(length=300)
    with pytest.raises(ValueError, match="budgets 0.6; ratio 0.5 asks for 0.5"):
        press.compress(prefill, 0.5)
    with pytest.raises(ValueError, match="needs an axis map"):
        REGISTRY["mixed"].compress(prefill, 0.4)
    linformer = REGISTRY[f"mixed({write_map(tmp_path / 'lin', {0.6: [('linformer', 0.5), ('knorm', 0.5)]})})"]
    with pytest.raises(ValueError, match="not context tokens"):
        linformer.compress(prefill, 0.4)


def test_equal_counts_need_no_mask(tmp_path) -> None:
    run = write_map(tmp_path / "run", {0.5: [("knorm", 0.5), ("snapkv", 0.5)]})
    prefill, _ = make_prefill(length=300)
    got = REGISTRY[f"mixed({run})"].compress(prefill, 0.5)
    assert got.valid is None and got.counts().tolist() == [150, 150]
    assert torch.equal(got.kept[0], REGISTRY["knorm"].compress(prefill, 0.5).kept[0])
    assert torch.equal(got.kept[1], REGISTRY["snapkv"].compress(prefill, 0.5).kept[1])
