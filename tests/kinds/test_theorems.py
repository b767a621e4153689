"""`spectra theorems` as a registered analysis: its options and what run.json records of them."""

from __future__ import annotations

import pytest

from spectra.errors import SpectraError
from spectra.kinds.theorems import TheoremOptions


def test_options_check_and_default_their_budgets() -> None:
    options = TheoremOptions(budget=(8, 4), eps=0.5)
    assert options.budget == (4, 8) and options.eps == (0.5,)
    assert options.recorded() == {"budget": [4, 8], "eps": [0.5], "draws": 1, "fixed_projection": False}
    assert TheoremOptions().resolved(512).budget == (16, 32, 64, 128, 256)
    with pytest.raises(SpectraError, match="budget defaults to \\(16, 32, 64, 128, 256\\), more than length=40"):
        TheoremOptions().resolved(40)
    with pytest.raises(SpectraError, match="fixed_projection=True uses one R per layer and budget: it takes no draws"):
        TheoremOptions(fixed_projection=True, draws=2)
    with pytest.raises(SpectraError, match="d and heads must be at least 1"):
        TheoremOptions(synthetic=True, d=0)
