"""The Linformer's multi-head linear self-attention (Wang et al. 2020, eq. 7).

    head_i = softmax( Q W_i^Q (E_i K W_i^K)ᵀ / √d_k ) · F_i V W_i^V,    E_i, F_i ∈ R^{budget × n}

E_i and F_i (`Projections`) project the sequence dimension n of keys and values down to the budget k, so
attention costs O(n·k) instead of O(n²). Three entry points share one computation:

- `linear_attention(q, k, v, e, f, valid, scaling)` on already-projected q, k, v (B, H, n, d) — what the
  capture attention hands over, so `substitute(projections)` plugs eq. 7 into a pretrained model;
- `LinformerSelfAttention`, a standalone layer on hidden states (B, n, dim) with its own W^Q, W^K, W^V,
  W^O or those of a pretrained attention module (`LinformerSelfAttention.from_pretrained`);
- `Projections` (nn/projections.py), the E/F matrices of every (layer, head) under a sharing level.

Conventions (documented choices):
- Padded keys are excluded by zeroing their key/value rows before projecting, so they contribute nothing
  and a padded sequence gives the same result as the sequence alone (the reference implementation
  projects padding too). Eq. 7 mixes every key into each projected key, so causal attention (a mask
  per query) cannot be honoured and is refused.
- `project_at="after"` (default) is the paper's E (K W^K + 1 bᵀ); `project_at="before"` is the reference
  implementation's (E X) W^K + 1 bᵀ. They differ only by the key/value bias term (E 1 − 1) bᵀ, so they
  agree when the bias is zero. Already-projected q, k, v carry their bias, so `linear_attention` is
  "after" by construction.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..capture import Captured, Substitute
from ..config import ProjectAt, choose
from ..errors import SpectraError
from ..kernels import attend, eq7, project
from ..models import attention_linears
from .projections import Projections


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    e: torch.Tensor,
    f: torch.Tensor,
    valid: torch.Tensor | None = None,
    scaling: float | None = None,
) -> torch.Tensor:
    """Eq. 7 on projected q, k, v (B, H, n, d): softmax(q (E k)ᵀ · scaling) (F v) → (B, H, n, d) (`kernels.eq7`).

    e, f: (H or 1, budget, ≥ n), sliced to the first n columns. valid (B, n): the keys that are not
    padding (None: all); padded keys are zeroed before projecting. scaling defaults to 1/√d.
    """
    return eq7(q, k, v, e, f, valid, scaling)[0]


def substitute(projections: Projections, layers: Iterable[int] | None = None) -> Substitute:
    """A `capture.Substitute` that replaces the attention of `layers` (default all) by eq. 7."""
    chosen = None if layers is None else set(layers)

    def linformer(captured: Captured) -> torch.Tensor | None:
        if chosen is not None and captured.layer not in chosen:
            return None
        if captured.causal:
            raise SpectraError(
                "Linformer attention cannot be causal (eq. 7 mixes every key into each projected key); "
                "substitute it into a bidirectional encoder"
            )
        heads = captured.q.shape[1]
        if heads != projections.heads:
            raise SpectraError(f"the model has {heads} heads but the projections were built for {projections.heads}")
        e, f = projections.pair(captured.layer, captured.k.shape[-2])
        return linear_attention(captured.q, captured.k, captured.v, e, f, captured.valid, captured.scaling)

    return linformer


class LinformerSelfAttention(nn.Module):
    """Eq. 7 as a layer on hidden states x (B, n, dim) → (B, n, dim), the heads concatenated then W^O.

    `projections` and `layer` give E_i, F_i (several layer modules may hold one Projections for
    shared matrices). W^Q, W^K, W^V (nn.Linear(dim, dim)) and W^O are created unless given;
    `w_o=nn.Identity()` returns the concatenated heads. `project_at`: "after" (paper, E (K W^K)) or
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
        project_at: ProjectAt | str = ProjectAt.AFTER,
        w_q: nn.Linear | None = None,
        w_k: nn.Linear | None = None,
        w_v: nn.Linear | None = None,
        w_o: nn.Module | None = None,
        scaling: float | None = None,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise SpectraError(f"dim {dim} is not a multiple of heads {heads}")
        project_at = choose(ProjectAt, project_at, "project_at (after: the paper, before: the reference code)")
        if projections.heads != heads or not 0 <= layer < projections.layers:
            raise SpectraError(
                f"projections for {projections.layers} layers × {projections.heads} heads do not fit layer {layer} of {heads} heads"
            )
        self.dim, self.heads, self.d, self.layer, self.project_at = dim, heads, dim // heads, layer, project_at
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
        cls, attention: nn.Module, projections: Projections, layer: int, *, heads: int | None = None,
        project_at: ProjectAt | str = ProjectAt.AFTER,
    ) -> "LinformerSelfAttention":
        """Wrap the W^Q, W^K, W^V (and W^O when found) of a pretrained attention module, sharing its weights.

        `models.attention_linears` finds them; without a W^O the layer returns the concatenated heads.
        Uses the module's own scaling when it has one.
        """
        found = attention_linears(attention)
        heads = heads or found.heads
        if heads is None:
            raise SpectraError(f"cannot tell the number of heads of {type(attention).__name__}; pass heads=")
        return cls(
            found.w_q.in_features, heads, projections, layer, project_at=project_at, w_q=found.w_q, w_k=found.w_k,
            w_v=found.w_v, w_o=found.w_o if found.w_o is not None else nn.Identity(), scaling=found.scaling,
        )

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, dim) → (B, H, n, d)."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.d).transpose(1, 2)

    def _projected(self, x: torch.Tensor, proj: torch.Tensor, linear: nn.Linear, valid: torch.Tensor | None) -> torch.Tensor:
        """Projected keys or values (B, H, budget, d): E (X W + 1 bᵀ) after, (E X) W + 1 bᵀ before."""
        if self.project_at == ProjectAt.AFTER:
            return project(self._heads(linear(x)), proj, valid)
        x_bar = project(x[:, None], proj, valid)  # (B, H, budget, dim): E_i X
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
        k_bar = self._projected(x, e, self.w_k, valid)
        v_bar = self._projected(x, f, self.w_v, valid)
        heads = attend(q, k_bar, v_bar, self.scaling)  # (B, H, n, d)
        return self.w_o(heads.transpose(1, 2).reshape(batch, n, self.dim))
