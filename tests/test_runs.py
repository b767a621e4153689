"""Reading runs back: anything that is not a finished spectra run, or is damaged, is one line naming it."""

from __future__ import annotations

import pytest

from spectra import runs
from spectra.errors import SpectraError


def test_loading_something_else_is_one_line(tmp_path) -> None:
    with pytest.raises(SpectraError, match="is not a spectra run directory: it has no run.json"):
        runs.load_run(tmp_path)
    (tmp_path / "run.json").write_text('{"kind": "analyze"}')
    with pytest.raises(SpectraError, match="is not a readable spectra run"):
        runs.load_run(tmp_path)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(SpectraError, match="run.json is not readable"):
        runs.load_run(tmp_path)


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 truncated", b"\x93NUMPY random bytes"])
def test_a_damaged_npz_is_one_line(tmp_path, damage) -> None:
    (tmp_path / "run.json").write_text('{"kind": "analyze", "at": 1}')
    (tmp_path / "metrics.csv").write_text("layer,head\n0,0\n")
    (tmp_path / "curves.npz").write_bytes(damage)
    with pytest.raises(SpectraError, match="curves.npz is damaged or not written by spectra"):
        runs.load_run(tmp_path)
