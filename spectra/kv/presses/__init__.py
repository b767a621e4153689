"""KV-cache presses for `spectra cache`: one module per family of press, each declaring its names (`DECLARES`) and
registering them by name (see base.py); `REGISTRY[name]` imports the module on first use."""

from .base import (
    REGISTRY,
    Compressed,
    Prefill,
    Press,
    ScorerPress,
    evict,
    facts,
    full,
    n_kept,
    per_head,
    register,
    run_presses,
)

__all__ = ["REGISTRY", "Compressed", "Prefill", "Press", "ScorerPress", "evict", "facts", "full", "n_kept", "per_head",
           "register", "run_presses"]
