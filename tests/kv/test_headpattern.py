"""DuoAttention's pattern directory: written and read back as DuoAttention's loader reads it (np.loadtxt with a tab
delimiter, clipped to [0, 1], config.json's two sizes), and every damaged directory refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spectra.kv import headpattern
from spectra.errors import SpectraError


def test_written_then_read_as_duoattentions_loader_reads(tmp_path) -> None:
    scores = np.array([[1.2, 0.25], [-0.5, 0.75], [0.0, 1.0]])
    folder = headpattern.write(tmp_path / "pattern", scores, 4, 64)
    pattern = headpattern.read(folder)
    loaded = np.clip(np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t"), 0, 1)
    np.testing.assert_array_equal(pattern.scores, loaded)
    assert (pattern.layers, pattern.kv_heads, pattern.sink_size, pattern.recent_size) == (3, 2, 4, 64)
    assert json.loads((folder / "config.json").read_text()) == {"sink_size": 4, "recent_size": 64}


@pytest.mark.parametrize("damage, message", [
    (lambda folder: (folder / "config.json").unlink(), "config.json is missing"),
    (lambda folder: (folder / "config.json").write_text("{"), "not JSON"),
    (lambda folder: (folder / "config.json").write_text('{"sink_size": 4, "recent_size": -1}'), "whole numbers"),
    (lambda folder: (folder / "full_attention_heads.tsv").write_text("1\tx\n"), "not a tab-separated matrix"),
    (lambda folder: (folder / "full_attention_heads.tsv").write_text("nan\t1\n"), "not finite"),
])
def test_a_damaged_pattern_is_one_line(tmp_path, damage, message) -> None:
    folder = headpattern.write(tmp_path / "pattern", np.ones((2, 2)), 4, 8)
    damage(folder)
    with pytest.raises(SpectraError, match=message) as error:
        headpattern.check(str(folder))
    assert "\n" not in str(error.value)


def test_a_pattern_of_another_model_is_refused(tmp_path) -> None:
    pattern = headpattern.read(headpattern.write(tmp_path / "p", np.ones((2, 3)), 4, 8))
    headpattern.fits(pattern, 2, 3, "m", "p")
    headpattern.fits(pattern, 2, None, "m", "p")
    with pytest.raises(SpectraError, match="p is 2 layers × 3 key/value heads, but m has 30 × 3"):
        headpattern.fits(pattern, 30, 3, "m", "p")
