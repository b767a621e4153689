"""A press's settings: the keyword arguments of its kvpress peer that it declares (`Press.fields`, a literal the
registry reads without torch), and a copy of a press with some of them set otherwise.

kvpress configures a press by its dataclass fields (`ExpectedAttentionPress(epsilon=1e-2)`), and its evaluation
registry names such instances (`kv.configurations`); here a configuration is the registered press copied with other
values of the attributes it declares, so its code is the class's and its defaults stay the registered instance's.
"""

from __future__ import annotations

import copy
from typing import Any


def settings(press: Any) -> dict[str, object]:
    """The values of the settings `press` declares in `fields`, by name."""
    return {field: getattr(press, field) for field in press.fields}


def configured(press: Any, **values: object) -> Any:
    """`press` with the declared settings in `values` set (a copy; `press` itself where `values` is empty); a setting
    it does not declare is refused (ValueError: the registry checks a configuration before the model loads)."""
    unknown = sorted(set(values) - set(press.fields))
    if unknown:
        raise ValueError(f"{press.name} has no setting {', '.join(unknown)}; its settings: "
                         f"{', '.join(press.fields) or 'none'}")
    if not values:
        return press
    changed = copy.copy(press)
    for field, value in values.items():
        setattr(changed, field, value)
    return changed
