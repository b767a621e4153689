"""Sliding-window attention: which layers of a model see only their last W keys, and the band mask that says so.

Gemma 3 (and Gemma 2, Cohere 2, GPT-OSS, …) mix *local* layers, whose query at position t attends only to keys at
positions j with t − W < j ≤ t (transformers' `sliding_window_overlay`), with *global* layers that see every earlier
key; the config names each layer's kind (`layer_types`) and the window (`sliding_window`). Mistral-style configs give
a `sliding_window` for every layer and no `layer_types`. A local layer's cache never holds more than its window:
transformers' sliding-window cache keeps the last W − 1 tokens after the prefill (`kept`), which is exactly what the
next query may see. Everything in spectra that attends outside transformers' own forward (the task protocol's exact
prefill, its batched decoding, the NLL study's continuation) reads the windows from here, so a model with local layers
is never attended globally. What a press does to a local layer is `--local-layers` (`config.LocalLayers`, `kv.cell`,
`kv.locallayers`). Imports no
torch (the tensors come from the caller), so the checks before a model loads read a config.json's windows too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import SpectraError

if TYPE_CHECKING:
    import torch

#: the layer kinds of `config.layer_types` spectra attends as transformers does: global, or a sliding window
GLOBAL, LOCAL = "full_attention", "sliding_attention"


def setting(config, name: str, default=None):
    """A config's field `name`: a transformers config's attribute, or a config.json's key read as a dict."""
    return config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)


def windows(config) -> list[int | None]:
    """Each layer's sliding window W (None: the layer attends globally), from a transformers config (or its
    config.json read as a dict). One line of error for a layer kind spectra does not attend as transformers does
    (chunked, linear, …)."""
    text = setting(config, "text_config") or config
    layers = int(setting(text, "num_hidden_layers"))
    window = setting(text, "sliding_window")
    kinds = setting(text, "layer_types")
    if kinds is None:
        uses = setting(text, "use_sliding_window", True)
        return [int(window) if window and uses else None] * layers
    unknown = sorted({kind for kind in kinds if kind not in (GLOBAL, LOCAL)})
    if unknown:
        raise SpectraError(f"the model's layers attend as {', '.join(unknown)}, which spectra's task protocol does not "
                           f"reproduce (it knows {GLOBAL} and {LOCAL}): use a model whose layers are global or "
                           "sliding-window")
    if LOCAL in kinds and not window:
        raise SpectraError("the model declares sliding-window layers but no sliding_window size in its config")
    return [int(window) if kind == LOCAL else None for kind in kinds]


def windowed(config) -> bool | None:
    """Whether some layers of a config (or config.json) attend through a sliding window; None where it cannot tell (no
    layer count, or a layer kind spectra refuses, which `windows` says once the model loads)."""
    try:
        return any(window is not None for window in windows(config))
    except (SpectraError, TypeError, ValueError):
        return None


def of_model(model: torch.nn.Module) -> list[int | None]:
    """`windows` of a loaded model's config."""
    return windows(model.config)


def kept(length: int, window: int) -> int:
    """The context tokens a local layer of window W holds after a prefill of `length` tokens: the last W − 1 (all of
    them when fewer), which is every key the next position may attend to."""
    return min(length, window - 1)


def band(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """(…, n, m) bool: which keys at `key_positions` (…, m) the queries at `query_positions` (…, n) attend to —
    causally (j ≤ t) and, with a `window`, within it (t − W < j)."""
    delta = query_positions[..., :, None] - key_positions[..., None, :]
    allowed = delta >= 0
    return allowed if window is None else allowed & (delta < window)
