"""`spectra theorems` as a registered analysis: its options and what run.json records of them."""

from __future__ import annotations

import pytest

import spectra
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


@pytest.mark.parametrize("given, named", [({"model": "some-model"}, "model"), ({"data": "corpus.txt"}, "data"),
                                          ({"model": "m", "split": "train"}, "model, split")])
def test_synthetic_refuses_a_model_or_corpus_it_would_ignore(given, named, tmp_path) -> None:
    """Gaussian q, k, v read no model or corpus: naming one with synthetic=True is refused, not silently ignored."""
    args = {"model": None, **given}
    with pytest.raises(SpectraError, match=f"synthetic=True draws Gaussian q, k, v and reads no model or corpus, "
                                           f"but {named} (was|were) given"):
        spectra.theorems(args.pop("model"), synthetic=True, length=16, samples=2, budget=4, out=tmp_path / "run",
                         progress=None, notify=lambda line: None, **args)
    assert not (tmp_path / "run").exists()
