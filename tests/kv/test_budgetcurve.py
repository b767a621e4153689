"""The LU-KV budget curve files `lukv(FILE)` reads: the row a ratio picks, and bad files refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from spectra.errors import SpectraError
from spectra.kv import budgetcurve


def test_the_ratio_picks_the_curves_row() -> None:
    assert [budgetcurve.row(r) for r in (0.001, 0.01, 0.125, 0.5, 0.995, 0.999)] == [0, 0, 11, 49, 98, 98]


def test_bad_curves_are_refused_in_one_line(tmp_path) -> None:
    curve_file = tmp_path / "curve.npy"
    np.save(curve_file, np.zeros((99, 3, 2), dtype=np.float32))
    np.save(tmp_path / "flat.npy", np.zeros((99, 4)))
    np.save(tmp_path / "short.npy", np.zeros((98, 2, 2)))
    np.save(tmp_path / "nan.npy", np.full((99, 2, 2), np.nan))
    (tmp_path / "text.npy").write_text("not an array")
    for name, message in [("missing.npy", "no such file"),
                          ("flat.npy", r"must be a numeric array of shape \(99, layers"),
                          ("short.npy", r".*, got float64 \(98, 2, 2\)"),
                          ("nan.npy", "holds a value that is not finite"), ("text.npy", "not a .npy array")]:
        with pytest.raises(SpectraError, match=f"^LU-KV budget curve {tmp_path / name}: {message}"):
            budgetcurve.check(str(tmp_path / name))
    with pytest.raises(SpectraError, match=r"is a budget curve for 3 layers × 2 key/value heads, but m has 30 × 3"):
        budgetcurve.fits(budgetcurve.read(curve_file), 30, 3, "m", str(curve_file))
    budgetcurve.fits(budgetcurve.read(curve_file), 3, 2, "m", str(curve_file))
    assert budgetcurve.read(curve_file).dtype == np.float64 and budgetcurve.read(curve_file).shape == (99, 3, 2)
