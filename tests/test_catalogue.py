"""The torch-free catalogue of method names equals the methods' registry, and expands user names like it."""

from __future__ import annotations

import pytest

from spectra import catalogue
from spectra.config import Sharing
from spectra.errors import SpectraError


def test_the_catalogue_is_the_registry_label_for_label() -> None:
    from spectra import methods

    assert catalogue.LABELS == tuple(methods.REGISTRY), "a method registered without its catalogue line (or gone)"
    for family, labels in catalogue.FAMILIES.items():
        assert all(methods.REGISTRY[label].family == family for label in labels), family
    assert catalogue.SHARING == tuple(level.value for level in Sharing)
    assert catalogue.CAUSAL == {label for label, method in methods.REGISTRY.items() if method.causal}
    assert catalogue.CALIBRATES == {label for label, method in methods.REGISTRY.items() if method.calibrates}


def test_names_expand_to_labels() -> None:
    assert catalogue.expand(["svd", "linformer"]) == ["svd"] + [f"linformer({s.value})" for s in Sharing]
    assert catalogue.expand(["linformer(kv)", "svd", " linformer(kv)"]) == ["linformer(kv)", "svd"]
    assert catalogue.expand(["nystrom"]) == ["nystrom"], "the iterative variant is a name of its own"
    assert catalogue.expand(["fastformer-fit"]) == ["fastformer-fit"], "the causal variant is a family of its own"
    with pytest.raises(SpectraError, match="unknown method 'fastformer'; valid methods: .*fastformer-fit.*probsparse"):
        catalogue.expand(["fastformer"])
    with pytest.raises(SpectraError, match="unknown method 'lsh'; valid methods: .*linformer-fit.*topk"):
        catalogue.expand(["lsh"])
    with pytest.raises(SpectraError, match="no method given"):
        catalogue.expand([])
    listed = catalogue.listing().split(", ")
    assert listed[:3] == ["svd", "svd-causal", "jl"] and "linformer(kv)" in listed and len(set(listed)) == len(listed)


def test_the_presses_are_the_registry_name_for_name() -> None:
    from spectra import presses

    assert catalogue.PRESSES == tuple(presses.REGISTRY), "a press registered without its catalogue line (or gone)"
    assert catalogue.CHANNEL_PRESSES == {name for name, press in presses.REGISTRY.items() if press.channels}
    assert catalogue.ROPE_PRESSES == {name for name, press in presses.REGISTRY.items() if press.needs_rope}
    assert catalogue.WINDOW_PRESSES == {name for name, press in presses.REGISTRY.items() if press.windowed}
    assert catalogue.CALIBRATING_PRESSES == {name for name, press in presses.REGISTRY.items() if press.calibrates}
    assert catalogue.presses(["tova", " knorm", "tova"]) == ("tova", "knorm")
    with pytest.raises(SpectraError, match="unknown press 'h2o'; valid presses: streaming, knorm"):
        catalogue.presses(["h2o"])
    with pytest.raises(SpectraError, match="no press given"):
        catalogue.presses([])
