"""Figures drawn by a test are closed after it, so a long run never holds dozens of open figures."""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import pytest


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    plt.close("all")
