"""The Linformer's multi-head linear self-attention (Wang et al. 2020, eq. 7).

    head_i = softmax( Q W_i^Q (E_i K W_i^K)ᵀ / √d_k ) · F_i V W_i^V,    E_i, F_i ∈ R^{k_proj × n}

E_i and F_i project the sequence dimension n of keys and values down to k_proj, so attention costs
O(n·k_proj) instead of O(n²). Three entry points share one computation:

- `linear_attention(q, k, v, e, f, mask, scaling)` on already-projected q, k, v (B, H, n, d) — what the
  capture attention hands over, so `substitute(projections)` plugs eq. 7 into a pretrained model;
- `LinformerSelfAttention`, a standalone layer on hidden states (B, n, dim) with its own W^Q, W^K, W^V,
  W^O or those of a pretrained attention module (`LinformerSelfAttention.from_pretrained`);
- `Projections`, the E/F matrices of every (layer, head) under a sharing level, one object that several
  layer modules can hold so that shared matrices are shared parameters.

Conventions (documented choices):
- Projection weights have shape (k_proj, max_len), as the reference implementation's
  nn.Linear(max_len, k_proj) weights; a sequence of m ≤ max_len tokens uses the first m columns.
- Padded keys are excluded by zeroing their key/value rows before projecting, so they contribute nothing
  and a padded sequence gives the same result as the sequence alone (the reference implementation
  compresses padding too). Only key-padding masks can be honoured: eq. 7 mixes all keys into each
  projected key, so a mask that blocks keys per query (causal) is rejected.
- `compress="after"` (default) is the paper's E (K W^K + 1 bᵀ); `compress="before"` is the reference
  implementation's (E X) W^K + 1 bᵀ. They differ only by the key/value bias term (E 1 − 1) bᵀ, so they
  agree when the bias is zero. Already-projected q, k, v carry their bias, so `linear_attention` is
  "after" by construction.
- Sharing levels: "none" (E_i, F_i per head: 2·L·H matrices), "headwise" (one E and one F per layer:
  2·L), "kv" (E = F per layer: L), "layerwise" (one matrix for all layers, heads, keys and values: 1).
  "none" is eq. 7 as written; the reference implementation's default is "headwise".
"""

from __future__ import annotations

import math
from typing import Iterable, Literal, Mapping

import torch
from torch import nn

from .capture import Substitute, key_valid
from .errors import SpectraError
from .theory import derive_seed, jl_matrix

SHARING = ("none", "headwise", "kv", "layerwise")
INITS = ("jl", "xavier")
COMPRESS = ("after", "before")
Sharing = Literal["none", "headwise", "kv", "layerwise"]
#: (layer, head, which) after sharing: -1 marks an index shared across, which ∈ {"e", "f", "ef"}
Key = tuple[int, int, str]
_WHICH = {"e": 1, "f": 2, "ef": 3}
_TAG = 101  # seed domain of Linformer projections (theory.py uses others)


def check_sharing(sharing: str) -> None:
    if sharing not in SHARING:
        raise SpectraError(f"unknown sharing '{sharing}'; use one of {', '.join(SHARING)}")


def check_k_proj(k_proj: int, n: int | None = None, what: str = "the sequence length") -> None:
    """k_proj must be a positive integer, and ≤ n when a limit is given."""
    if isinstance(k_proj, bool) or not isinstance(k_proj, int) or k_proj < 1:
        raise SpectraError(f"k_proj must be a positive integer, got {k_proj!r}; pass a value ≥ 1 (e.g. 64)")
    if n is not None and k_proj > n:
        raise SpectraError(f"k_proj = {k_proj} exceeds {what} ({n}); Linformer projects n → k_proj ≤ n, use a smaller k_proj")


def projection_key(sharing: str, layer: int, head: int, which: str) -> Key:
    """The distinct matrix that (layer, head, which ∈ {"e", "f"}) uses under `sharing`."""
    check_sharing(sharing)
    if sharing == "none":
        return (layer, head, which)
    if sharing == "headwise":
        return (layer, -1, which)
    if sharing == "kv":
        return (layer, -1, "ef")
    return (-1, -1, "ef")  # layerwise


def distinct_keys(sharing: str, layers: int, heads: int) -> list[Key]:
    """Every distinct projection under `sharing`, in a fixed order (layer, head, e before f)."""
    check_sharing(sharing)
    keys: dict[Key, None] = {}
    for layer in range(layers):
        for head in range(heads):
            for which in ("e", "f"):
                keys[projection_key(sharing, layer, head, which)] = None
    return list(keys)


def jl_projection(key: Key, k_proj: int, max_len: int, seed: int = 0) -> torch.Tensor:
    """The seeded JL matrix N(0, 1/k_proj) of shape (k_proj, max_len) for one distinct key."""
    layer, head, which = key
    return jl_matrix(k_proj, max_len, derive_seed(seed, _TAG, k_proj, layer + 1, head + 1, _WHICH[which]))


def jl_pair(
    sharing: str, layer: int, heads: int, k_proj: int, n: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """E and F (H, k_proj, n) of one layer, drawn exactly as `Projections(init="jl")` draws them.

    Draws only this layer's matrices, so a probe can evaluate eq. 7 layer by layer without holding
    every layer's projections.
    """
    check_k_proj(k_proj)
    drawn: dict[Key, torch.Tensor] = {}

    def get(head: int, which: str) -> torch.Tensor:
        key = projection_key(sharing, layer, head, which)
        if key not in drawn:
            drawn[key] = jl_projection(key, k_proj, n, seed)
        return drawn[key]

    e = torch.stack([get(head, "e") for head in range(heads)])
    f = torch.stack([get(head, "f") for head in range(heads)])
    return e, f


def _xavier(k_proj: int, max_len: int, seed: int) -> torch.Tensor:
    """The reference implementation's init of its nn.Linear(max_len, k_proj) compression weights:
    xavier_uniform_ with gain 1/√2, i.e. U(−a, a) with a = (1/√2)·√(6 / (max_len + k_proj))."""
    bound = math.sqrt(3.0 / (max_len + k_proj))
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(k_proj, max_len, generator=generator, dtype=torch.float64) * 2 - 1).mul(bound).float()


def _name(key: Key) -> str:
    layer, head, which = key
    return f"l{'x' if layer < 0 else layer}_h{'x' if head < 0 else head}_{which}"


class Projections(nn.Module):
    """E_i, F_i for every (layer, head) of a model under one sharing level; shared matrices are one parameter.

    Each distinct matrix has shape (k_proj, max_len). `init`: "jl" — seeded N(0, 1/k_proj) (the JL
    matrices of the paper's theory); "xavier" — the reference implementation's xavier_uniform_(gain 1/√2);
    or pass `weights` to load given matrices (a mapping from `keys` to tensors, or a tensor stacked in
    `keys` order, or one (k_proj, max_len) tensor when there is a single distinct matrix).
    `delta` applies Theorem 2's scaling E = δR, F = e^{−δ}R on top of the stored R (so "kv" and
    "layerwise" still store one R, used with two scale factors).
    """

    def __init__(
        self,
        layers: int,
        heads: int,
        k_proj: int,
        max_len: int,
        sharing: Sharing = "headwise",
        *,
        init: str = "jl",
        seed: int = 0,
        delta: float | None = None,
        weights: torch.Tensor | Mapping[Key, torch.Tensor] | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        check_sharing(sharing)
        check_k_proj(k_proj, max_len, "max_len")
        if layers < 1 or heads < 1:
            raise SpectraError(f"layers and heads must be ≥ 1, got {layers} and {heads}")
        if init not in INITS:
            raise SpectraError(f"unknown init '{init}'; use one of {', '.join(INITS)} or pass weights")
        if delta is not None and not delta >= 0:
            raise SpectraError(f"delta must be ≥ 0 (Theorem 2 uses a small positive constant), got {delta}")
        self.layers, self.heads, self.k_proj, self.max_len, self.sharing = layers, heads, k_proj, max_len, sharing
        self.e_scale = 1.0 if delta is None else float(delta)
        self.f_scale = 1.0 if delta is None else math.exp(-float(delta))
        self.keys = distinct_keys(sharing, layers, heads)
        given = self._given(weights) if weights is not None else None
        self.weights = nn.ParameterDict()
        for i, key in enumerate(self.keys):
            if given is not None:
                matrix = given[i]
            elif init == "jl":
                matrix = jl_projection(key, k_proj, max_len, seed)
            else:
                layer, head, which = key
                matrix = _xavier(k_proj, max_len, derive_seed(seed, _TAG + 1, k_proj, layer + 1, head + 1, _WHICH[which]))
            self.weights[_name(key)] = nn.Parameter(matrix, requires_grad=trainable)

    def _given(self, weights: torch.Tensor | Mapping[Key, torch.Tensor]) -> list[torch.Tensor]:
        shape = (self.k_proj, self.max_len)
        if isinstance(weights, Mapping):
            missing = [key for key in self.keys if key not in weights]
            if missing:
                raise SpectraError(
                    f"weights lack the projections {missing[:3]}; sharing '{self.sharing}' needs keys {self.keys[:3]}…"
                )
            found = [torch.as_tensor(weights[key]) for key in self.keys]
        else:
            weights = torch.as_tensor(weights)
            found = [weights] if weights.dim() == 2 and len(self.keys) == 1 else list(weights)
            if weights.dim() != 3 and not (weights.dim() == 2 and len(self.keys) == 1) or len(found) != len(self.keys):
                raise SpectraError(
                    f"weights of shape {tuple(weights.shape)} do not fit sharing '{self.sharing}': "
                    f"expected ({len(self.keys)}, {self.k_proj}, {self.max_len})"
                )
        for matrix in found:
            if tuple(matrix.shape) != shape:
                raise SpectraError(f"a projection has shape {tuple(matrix.shape)}; expected (k_proj, max_len) = {shape}")
        return [matrix.detach().clone().float() for matrix in found]

    @property
    def count(self) -> int:
        """Number of distinct projection matrices (2·L·H, 2·L, L or 1)."""
        return len(self.keys)

    def matrix(self, layer: int, head: int, which: str) -> torch.Tensor:
        """The stored R (k_proj, max_len) that E ("e") or F ("f") of (layer, head) is made of, unscaled."""
        if not (0 <= layer < self.layers and 0 <= head < self.heads and which in ("e", "f")):
            raise SpectraError(f"no projection ({layer}, {head}, {which!r}) in {self.layers} layers × {self.heads} heads")
        return self.weights[_name(projection_key(self.sharing, layer, head, which))]

    def pair(self, layer: int, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """E and F (H, k_proj, n) of one layer, scaled (Theorem 2's δ) and sliced to the first n columns."""
        n = self.max_len if n is None else n
        if n > self.max_len:
            raise SpectraError(
                f"a sequence of {n} tokens is longer than the projections' max_len {self.max_len}; "
                f"build Projections with max_len ≥ {n}"
            )
        e = torch.stack([self.matrix(layer, head, "e")[:, :n] for head in range(self.heads)])
        f = torch.stack([self.matrix(layer, head, "f")[:, :n] for head in range(self.heads)])
        return e * self.e_scale, f * self.f_scale


def padding_valid(mask: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Valid keys (B, n) of an additive mask that only masks padding; rejects per-query masks such as causal."""
    valid = key_valid(mask, batch, n, device)
    if mask is not None:
        blocked = mask[:, 0] <= torch.finfo(mask.dtype).min / 2
        as_padding = (blocked == ~valid[:, None, :]) | blocked.all(-1, keepdim=True)
        if not bool(as_padding.all()):
            raise SpectraError(
                "Linformer attention supports key-padding masks only (eq. 7 mixes every key into each projected key); "
                "the mask blocks keys per query, as a causal mask does — use a bidirectional encoder"
            )
    return valid


def compress(x: torch.Tensor, proj: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """E·x along the sequence: x (B, H|1, n, c), proj (H|1, k_proj, ≥n) or (k_proj, ≥n) → (B, H, k_proj, c).

    Uses the first n columns of proj (the slicing rule); rows of padded positions (valid (B, n) False)
    are zeroed first so they contribute nothing.
    """
    n = x.shape[-2]
    if proj.shape[-1] < n:
        raise SpectraError(
            f"a sequence of {n} tokens is longer than the projection's {proj.shape[-1]} columns; "
            f"use projections with max_len ≥ {n}"
        )
    proj = proj[..., :n].to(device=x.device, dtype=x.dtype)
    proj = proj[None] if proj.dim() == 2 else proj
    if valid is not None:
        x = x.masked_fill(~valid[:, None, :, None], 0.0)
    heads = max(x.shape[1], proj.shape[0])  # either side may be shared across heads (size 1)
    return torch.einsum("hcn,bhnx->bhcx", proj.expand(heads, -1, -1), x.expand(-1, heads, -1, -1))


def attend(q: torch.Tensor, k_bar: torch.Tensor, v_bar: torch.Tensor, scaling: float | None = None) -> torch.Tensor:
    """softmax(q k̄ᵀ · scaling) v̄: q (B, H, n, d), k̄ and v̄ (B, H, k_proj, d) → (B, H, n, d)."""
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    p_bar = torch.softmax(torch.einsum("bhid,bhcd->bhic", q, k_bar) * scaling, dim=-1)  # (B, H, n, k_proj)
    return torch.einsum("bhic,bhcd->bhid", p_bar, v_bar)


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    e: torch.Tensor,
    f: torch.Tensor,
    mask: torch.Tensor | None = None,
    scaling: float | None = None,
) -> torch.Tensor:
    """Eq. 7 on projected q, k, v (B, H, n, d): softmax(q (E k)ᵀ · scaling) (F v) → (B, H, n, d).

    e, f: (H or 1, k_proj, ≥ n), sliced to the first n columns. mask: the additive (B, 1, n, n) mask of
    the capture attention or None; padded keys are zeroed before projecting. scaling defaults to 1/√d.
    """
    valid = padding_valid(mask, q.shape[0], k.shape[-2], q.device)
    return attend(q, compress(k, e, valid), compress(v, f, valid), scaling)


def substitute(projections: Projections, layers: Iterable[int] | None = None) -> Substitute:
    """A `capture.Substitute` that replaces the attention of `layers` (default all) by eq. 7."""
    chosen = None if layers is None else set(layers)

    def linformer(layer: int, q, k, v, mask, scaling: float) -> torch.Tensor | None:
        if chosen is not None and layer not in chosen:
            return None
        if q.shape[1] != projections.heads:
            raise SpectraError(f"the model has {q.shape[1]} heads but the projections were built for {projections.heads}")
        e, f = projections.pair(layer, k.shape[-2])
        return linear_attention(q, k, v, e, f, mask, scaling)

    return linformer


#: attribute names of (query, key, value, output) linears in common attention modules
_LINEAR_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"))
_OUT_NAMES = ("output.dense", "o_proj", "out_proj", "out_lin", "dense")
_HEAD_NAMES = ("num_attention_heads", "num_heads", "n_heads")


def _find(module: nn.Module, dotted: str) -> nn.Module | None:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


class LinformerSelfAttention(nn.Module):
    """Eq. 7 as a layer on hidden states x (B, n, dim) → (B, n, dim), the heads concatenated then W^O.

    `projections` and `layer` give E_i, F_i (several layer modules may hold one Projections for
    shared matrices). W^Q, W^K, W^V (nn.Linear(dim, dim)) and W^O are created unless given;
    `w_o=nn.Identity()` returns the concatenated heads. `compress`: "after" (paper, E (K W^K)) or
    "before" (reference, (E X) W^K); see the module docstring.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        projections: Projections,
        layer: int = 0,
        *,
        bias: bool = True,
        compress: str = "after",
        w_q: nn.Linear | None = None,
        w_k: nn.Linear | None = None,
        w_v: nn.Linear | None = None,
        w_o: nn.Module | None = None,
        scaling: float | None = None,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise SpectraError(f"dim {dim} is not a multiple of heads {heads}")
        if compress not in COMPRESS:
            raise SpectraError(f"unknown compress '{compress}'; use 'after' (paper) or 'before' (reference code)")
        if projections.heads != heads or not 0 <= layer < projections.layers:
            raise SpectraError(
                f"projections for {projections.layers} layers × {projections.heads} heads do not fit layer {layer} of {heads} heads"
            )
        self.dim, self.heads, self.d, self.layer, self.compress = dim, heads, dim // heads, layer, compress
        self.projections = projections
        self.w_q = w_q or nn.Linear(dim, dim, bias=bias)
        self.w_k = w_k or nn.Linear(dim, dim, bias=bias)
        self.w_v = w_v or nn.Linear(dim, dim, bias=bias)
        self.w_o = w_o if w_o is not None else nn.Linear(dim, dim, bias=bias)
        for name in ("w_q", "w_k", "w_v"):
            linear = getattr(self, name)
            if (linear.in_features, linear.out_features) != (dim, dim):
                raise SpectraError(f"{name} maps {linear.in_features} → {linear.out_features}; expected {dim} → {dim}")
        self.scaling = self.d**-0.5 if scaling is None else scaling

    @classmethod
    def from_pretrained(
        cls, attention: nn.Module, projections: Projections, layer: int, *, heads: int | None = None, compress: str = "after"
    ) -> "LinformerSelfAttention":
        """Wrap the W^Q, W^K, W^V (and W^O when found) of a pretrained attention module, sharing its weights.

        Looks for query/key/value, q_proj/k_proj/v_proj or q_lin/k_lin/v_lin in the module or its `self`
        child (BERT-style), and for W^O in output.dense, o_proj, out_proj, out_lin; without one, the layer
        returns the concatenated heads. Uses the module's own scaling when it has one.
        """
        inner = attention
        for candidate in (attention, getattr(attention, "self", None)):
            if candidate is not None and any(hasattr(candidate, names[0]) for names in _LINEAR_NAMES):
                inner = candidate
                break
        names = next((names for names in _LINEAR_NAMES if hasattr(inner, names[0])), None)
        linears = None if names is None else tuple(getattr(inner, name, None) for name in names)
        if linears is None or not all(isinstance(m, nn.Linear) for m in linears):
            raise SpectraError(
                f"cannot find the query/key/value linears of {type(attention).__name__}; pass w_q, w_k, w_v explicitly"
            )
        w_o = next((m for name in _OUT_NAMES for m in (_find(attention, name),) if isinstance(m, nn.Linear)), None)
        if heads is None:
            heads = next((int(getattr(inner, n)) for n in _HEAD_NAMES if hasattr(inner, n)), None)
            heads = heads or getattr(getattr(inner, "config", None), "num_attention_heads", None)
        if heads is None:
            raise SpectraError(f"cannot tell the number of heads of {type(attention).__name__}; pass heads=")
        w_q, w_k, w_v = linears
        return cls(
            w_q.in_features, heads, projections, layer, compress=compress, w_q=w_q, w_k=w_k, w_v=w_v,
            w_o=w_o if w_o is not None else nn.Identity(), scaling=getattr(inner, "scaling", None),
        )

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, dim) → (B, H, n, d)."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.d).transpose(1, 2)

    def _compressed(self, x: torch.Tensor, proj: torch.Tensor, linear: nn.Linear, valid: torch.Tensor | None) -> torch.Tensor:
        """Projected keys or values (B, H, k_proj, d): E (X W + 1 bᵀ) after, (E X) W + 1 bᵀ before."""
        if self.compress == "after":
            return compress(self._heads(linear(x)), proj, valid)
        x_bar = compress(x[:, None], proj, valid)  # (B, H, k_proj, dim): E_i X
        weight = linear.weight.view(self.heads, self.d, self.dim)
        out = torch.einsum("bhcx,hdx->bhcd", x_bar, weight)
        if linear.bias is not None:
            out = out + linear.bias.view(1, self.heads, 1, self.d)
        return out

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, n, dim); attention_mask (B, n), nonzero/True for real tokens (the tokenizer's mask)."""
        batch, n, _ = x.shape
        valid = None if attention_mask is None else attention_mask.to(device=x.device).bool()
        e, f = self.projections.pair(self.layer, n)
        q = self._heads(self.w_q(x))
        k_bar = self._compressed(x, e, self.w_k, valid)
        v_bar = self._compressed(x, f, self.w_v, valid)
        heads = attend(q, k_bar, v_bar, self.scaling)  # (B, H, n, d)
        return self.w_o(heads.transpose(1, 2).reshape(batch, n, self.dim))
