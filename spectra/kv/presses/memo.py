"""A layer's scores computed once and reused by every cell of its example: a run compresses each example's prefill at
every ratio (and with configurations of one class that score alike), and a scorer whose scores do not depend on the
ratio would otherwise recompute them for each — Compactor's, CAPKV's and Expected Attention's took about 60% of the
prose board's time (py-spy, issue 51's rerun). `remembered` keeps them beside the `Prefill` they were computed from,
for as long as it lives (a weak reference: nothing outlives the example), under the press's class and settings, so a
press with other settings recomputes. Each caller gets its own copy (a wrapper may write into the scores it is
handed), equal bit for bit to a fresh computation."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any
from weakref import WeakKeyDictionary

import torch

from .base import Prefill, Press
from .fields import settings

_KEPT: WeakKeyDictionary[Prefill, dict[Hashable, Any]] = WeakKeyDictionary()


def key_of(press: Press, part: str = "scores") -> Hashable:
    """What tells a press's remembered `part` apart: its class, the settings it declares, and the part's name."""
    return type(press).__qualname__, tuple(sorted((name, repr(value)) for name, value in settings(press).items())), part


def remembered(prefill: Prefill, press: Press, compute: Callable[[], Any], part: str = "scores") -> Any:
    """`compute()` for this prefill layer and press (`key_of`), computed the first time it is asked for."""
    kept = _KEPT.setdefault(prefill, {})
    key = key_of(press, part)
    if key not in kept:
        kept[key] = compute()
    found = kept[key]
    if isinstance(found, tuple):
        return tuple(part.clone() if isinstance(part, torch.Tensor) else part for part in found)
    return found.clone() if isinstance(found, torch.Tensor) else found
