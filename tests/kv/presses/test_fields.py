"""A press's settings (`Press.fields`): a configured copy, the registered instance untouched, an undeclared setting
refused, and a fresh instance keeping them — for every press declaring fields, its attributes at the defaults it
declares."""

from __future__ import annotations

import pytest

from spectra.kv.presses import REGISTRY
from spectra.kv.presses.fields import configured, settings
from spectra.registry import PRESSES


def test_every_declared_field_is_the_instance_default() -> None:
    declaring = {name: entry.facts["fields"] for name, entry in PRESSES.entries().items()
                 if entry.facts.get("fields")}
    assert {"expected_attention", "chunkkv", "block"} <= set(declaring)
    for name, fields in declaring.items():
        assert settings(REGISTRY[name]) == fields, name


def test_configured_is_a_copy_with_the_values_set() -> None:
    press = REGISTRY["expected_attention"]
    changed = configured(press, epsilon=0.01)
    assert changed is not press and changed.epsilon == 0.01 and changed.use_vnorm is True
    assert press.epsilon == 0.0, "the registered instance is shared by every run: never changed"
    assert configured(press) is press
    assert changed.fresh().epsilon == 0.01, "a fresh instance for a run keeps the configuration"
    wrapped = configured(REGISTRY["chunkkv(snapkv)"], chunk_length=8)
    assert wrapped.fresh().chunk_length == 8 and wrapped.fresh().inner is not None


def test_an_undeclared_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="no setting alpha; its settings: epsilon, use_vnorm"):
        configured(REGISTRY["expected_attention"], alpha=1)
    with pytest.raises(ValueError, match="its settings: none"):
        configured(REGISTRY["knorm"], epsilon=0.1)
