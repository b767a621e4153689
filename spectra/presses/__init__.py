"""KV-cache presses for `spectra cache`: one module per family of press, registered by name (see base.py)."""

from . import eviction  # noqa: F401, I001  (registration, in this order: the order of tables)
from . import channels  # noqa: F401, E402
from . import leverage, loki, lowrank, linformer  # noqa: F401  (the spectral presses)
from .base import REGISTRY, Compressed, Prefill, Press, ScorerPress, evict, full, n_kept, register

__all__ = ["REGISTRY", "Compressed", "Prefill", "Press", "ScorerPress", "evict", "full", "n_kept", "register"]
