"""KV-cache presses for `spectra cache`: one module per family of press, each press a class that states its name and
facts in its body and is registered by its decorator (see base.py); `REGISTRY[name]` imports the module on first
use."""

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
