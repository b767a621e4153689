"""Every analysis on a fixed tiny model gives bitwise the outputs recorded in tests/golden/ (see regression.py).

Bitwise equality holds on the platform the baseline was made on (tests/golden/PLATFORM: torch and numpy
builds, CPU vector instructions); elsewhere floating-point kernels may round differently, so there the
files, columns and labels must agree and the numbers only to a tolerance.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

import regression
from frames import assert_frames_close


@pytest.fixture(scope="module")
def produced(tmp_path_factory, one_thread) -> dict[str, dict[str, bytes]]:
    return regression.make(tmp_path_factory.mktemp("regression"))


def _golden(case: str) -> dict[str, bytes]:
    folder = regression.GOLDEN / case
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def _close(name: str, got: bytes, want: bytes) -> None:
    """Same labels and shapes, numbers within 1e-4 relative (another platform's rounding)."""
    if name.endswith(".csv"):
        assert_frames_close(pd.read_csv(io.BytesIO(got)), pd.read_csv(io.BytesIO(want)), rtol=1e-4, atol=1e-7, name=name)
    elif name.endswith(".npz"):
        a, b = np.load(io.BytesIO(got)), np.load(io.BytesIO(want))
        assert sorted(a.files) == sorted(b.files)
        for key in b.files:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-7)
    else:
        assert got == want


@pytest.mark.parametrize("case", sorted(path.name for path in regression.GOLDEN.iterdir() if path.is_dir()))
def test_outputs_equal_the_baseline(case: str, produced) -> None:
    got, want = produced[case], _golden(case)
    assert sorted(got) == sorted(want), f"{case}: files differ"
    same_platform = (regression.GOLDEN / "PLATFORM").read_text() == regression.platform()
    for name in want:
        if same_platform:
            assert got[name] == want[name], f"{case}/{name} differs from tests/golden (bitwise)"
        else:
            _close(name, got[name], want[name])
