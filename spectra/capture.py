"""The capture attention: one function registered with transformers' attention interface.

It computes exactly what eager attention computes. For every layer and forward pass it builds one
`Captured` record — q, k, v, the valid keys, the score scale, whether attention is causal, and
P = softmax(q kᵀ · scaling + mask) formed only when someone reads it — hands it to the active observer
(the probes) and returns the exact output, or, when a substitution is active for that layer, the
substituted one. Nothing else in the package knows how transformers calls attention.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from .errors import InternalError, SpectraError
from .kernels import eager_p

NAME = "spectra"


@dataclass(frozen=True, eq=False)
class Captured:
    """One layer of one forward pass, as the attention function received it.

    `key`, `value` (B, H_kv, n, d) are per key/value head (grouped-query attention has H_kv < H);
    `k`, `v` repeat them to the H query heads, as eager attention does (no copy when H_kv = H).
    `valid` (B, n) marks the keys that take part (not padding): `known_valid`, or read off `mask` (the model's
    additive mask (B, 1, n, n) or None, also used to form P exactly as eager attention does) when first asked — an
    O(n²) pass a substitution that never reads it (the KV-cache prefill) does not pay. `index` holds each
    sequence's global index in the run: every record a run makes carries it (the sources pass it to
    `capturing`), because per-sequence randomness — bootstrap weights, random projections, landmark and key
    samples — is seeded by it, so no draw depends on batching or the number of processes. It is None
    only for records made outside a run (a forward pass of your own under `capturing` without `index`);
    `sequence_index()` refuses those.
    """

    layer: int
    q: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    known_valid: torch.Tensor | None
    scaling: float
    causal: bool = False
    mask: torch.Tensor | None = field(default=None, repr=False)
    index: tuple[int, ...] | None = None

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.q.shape[1] // self.key.shape[1]

    @cached_property
    def valid(self) -> torch.Tensor:
        if self.known_valid is not None:
            return self.known_valid
        return key_valid(self.mask, self.q.shape[0], self.key.shape[-2], self.q.device)

    @cached_property
    def k(self) -> torch.Tensor:
        return self.key if self.groups == 1 else self.key.repeat_interleave(self.groups, dim=1)

    @cached_property
    def v(self) -> torch.Tensor:
        return self.value if self.groups == 1 else self.value.repeat_interleave(self.groups, dim=1)

    @cached_property
    def p(self) -> torch.Tensor:
        """P = softmax(q kᵀ · scaling + mask) (B, H, n, n), computed as eager attention computes it."""
        return eager_p(self.q, self.k, self.scaling, self.mask)

    @classmethod
    def of(cls, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           scaling: float | None = None, causal: bool = False, index: tuple[int, ...] | None = None) -> Captured:
        """A record from tensors at hand (tests, synthetic inputs): the valid keys read off `mask`."""
        scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
        return cls(layer, q, k, v, key_valid(mask, q.shape[0], k.shape[-2], q.device), scaling, causal, mask, index)

    def sequence_index(self) -> list[int]:
        """Each sequence's global index in the run. A record without them (or with as many as it has
        sequences) is a bug in whatever made it: falling back to batch positions would tie every
        per-sequence draw to the batching, so it raises instead."""
        batch = self.q.shape[0]
        if self.index is None:
            raise InternalError(f"layer {self.layer}'s captured record has no sequence indices: whatever ran the "
                                "forward pass must pass the batch's global indices (capturing(index=…))")
        if len(self.index) != batch:
            raise InternalError(f"layer {self.layer}'s captured record has {len(self.index)} sequence indices for "
                                f"{batch} sequences")
        return list(self.index)


#: substitute(captured) -> head outputs (B, H, n, d), or None to keep exact attention for that layer
Substitute = Callable[[Captured], "torch.Tensor | None"]
#: observe(captured): what the probes do with each layer
Observe = Callable[[Captured], None]


def key_valid(mask: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Boolean (B, n): which key positions some query may attend to, read off the additive mask."""
    if mask is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    blocked = mask[:, 0] <= torch.finfo(mask.dtype).min / 2
    return ~blocked.all(dim=-2)


@dataclass
class _State:
    observe: Observe | None = None
    substitute: Substitute | None = None
    index: tuple[int, ...] | None = None
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
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eager attention with an observer and an optional substitution; same signature as transformers' backends."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
    layer = _layer_index(module)  # before counting this call
    _state.calls += 1
    _state.layers_seen.add(layer)
    captured = Captured(layer, query, key, value, None, scaling, bool(getattr(module, "is_causal", False)), mask,
                        _state.index)
    out = None
    if _state.substitute is not None and _state.observe is None:  # no one needs P: never form it
        out = _state.substitute(captured)
        if out is not None:
            return out.transpose(1, 2).contiguous(), None

    p = captured.p
    if _state.observe is not None:
        _state.observe(captured)
        if _state.substitute is not None:
            out = _state.substitute(captured)
    if out is None:
        p_used = nn.functional.dropout(p, p=dropout, training=module.training)
        out = torch.matmul(p_used, captured.v)
    return out.transpose(1, 2).contiguous(), p


AttentionInterface.register(NAME, spectra_attention)
AttentionMaskInterface.register(NAME, eager_mask)


@contextlib.contextmanager
def capturing(observe: Observe | None = None, substitute: Substitute | None = None,
              index: Sequence[int] | None = None) -> Iterator[_State]:
    """Activate an observer (and a substitution) for the forward passes run inside the block; `index` gives the
    batch's sequences' global indices to the records (required by every probe and by methods drawing per
    sequence: the sources always pass it)."""
    global _state
    previous = _state
    _state = _State(observe=observe, substitute=substitute, index=None if index is None else tuple(index))
    try:
        yield _state
    finally:
        _state = previous


def forward(model: nn.Module, layers: int, observe: Observe | None = None, substitute: Substitute | None = None,
            index: Sequence[int] | None = None, **inputs: Any) -> Any:
    """One forward pass of `model` with capture active; checks that all `layers` went through the capture."""
    with torch.inference_mode(), capturing(observe, substitute, index) as state:
        outputs = model(**inputs)
    if len(state.layers_seen) != layers:
        raise SpectraError(
            f"the model's attention did not go through transformers' AttentionInterface "
            f"({len(state.layers_seen)} of {layers} layers seen), so spectra cannot capture it"
        )
    return outputs
