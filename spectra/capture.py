"""The capture attention: one function registered with transformers' attention interface.

It computes exactly what eager attention computes, hands each layer's q, k, v, additive mask and
P = softmax(q kᵀ · scaling + mask) to the active probes, and returns the exact output — or, when a
substitution is active for that layer, the substituted (approximate) output. Nothing else in the
package knows how transformers is wired.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

NAME = "spectra"


class Probe(Protocol):
    """A streaming reducer fed once per layer and forward pass; `scaling` is the layer's score scale (1/√d)."""

    def update(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
        p: torch.Tensor, *, scaling: float,
    ) -> None: ...


#: substitute(layer, q, k, v, mask, scaling) -> head outputs (B, H, n, d), or None to keep exact attention.
Substitute = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor | None]


@dataclass
class _State:
    probes: Sequence[Probe] = ()
    substitute: Substitute | None = None
    calls: int = 0
    layers_seen: set[int] = field(default_factory=set)


_state = _State()


def _layer_index(module: nn.Module) -> int:
    """module.layer_idx, or for models without it (DistilBERT, ALBERT) the call's position in the forward pass."""
    layer = getattr(module, "layer_idx", None)
    if layer is not None:
        return int(layer)
    layers = getattr(getattr(module, "config", None), "num_hidden_layers", None)
    if not layers:
        raise RuntimeError(f"{type(module).__name__} has neither layer_idx nor config.num_hidden_layers")
    return _state.calls % layers


def spectra_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with probes and an optional substitution; same signature as transformers' backends."""
    q, k, v = query, key, value
    if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat k/v heads as eager does
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = q.shape[-1] ** -0.5
    mask = attention_mask[:, :, :, : k.shape[-2]] if attention_mask is not None else None

    layer = _layer_index(module)  # before counting this call
    _state.calls += 1
    _state.layers_seen.add(layer)
    if _state.substitute is not None and not _state.probes:  # no one needs P: never form it
        out = _state.substitute(layer, q, k, v, mask, scaling)
        if out is not None:
            return out.transpose(1, 2).contiguous(), None

    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    if mask is not None:
        scores = scores + mask
    p = nn.functional.softmax(scores, dim=-1)
    for probe in _state.probes:
        probe.update(layer, q, k, v, mask, p, scaling=scaling)

    out = None
    if _state.substitute is not None:
        out = _state.substitute(layer, q, k, v, mask, scaling)
    if out is None:
        p_used = nn.functional.dropout(p, p=dropout, training=module.training)
        out = torch.matmul(p_used, v)
    return out.transpose(1, 2).contiguous(), p


AttentionInterface.register(NAME, spectra_attention)
AttentionMaskInterface.register(NAME, eager_mask)


@contextlib.contextmanager
def capturing(probes: Sequence[Probe] = (), substitute: Substitute | None = None) -> Iterator[_State]:
    """Activate probes (and a substitution) for the forward passes run inside the block."""
    global _state
    previous = _state
    _state = _State(probes=tuple(probes), substitute=substitute)
    try:
        yield _state
    finally:
        _state = previous


def key_valid(mask: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Boolean (B, n): which key positions take part in attention, read off the additive mask."""
    if mask is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    blocked = mask[:, 0] <= torch.finfo(mask.dtype).min / 2
    return ~blocked.all(dim=-2)
