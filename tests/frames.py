"""Comparing tidy result tables: the same labels exactly, the same numbers to a tolerance."""

from __future__ import annotations

import numpy as np
import pandas as pd


def assert_frames_close(got: pd.DataFrame, want: pd.DataFrame, *, rtol: float, atol: float, name: str = "") -> None:
    """Same columns, rows and non-numeric cells; numeric cells within rtol/atol (NaN equal to NaN)."""
    assert list(got.columns) == list(want.columns) and len(got) == len(want), name
    numeric = want.select_dtypes("number").columns
    assert got.drop(columns=numeric).equals(want.drop(columns=numeric)), name
    np.testing.assert_allclose(got[numeric].to_numpy(float), want[numeric].to_numpy(float), rtol=rtol, atol=atol,
                               err_msg=name)
