"""The attention primitives, once: the scaled scores, the keys a query may see, the masked softmax, P as eager
attention forms it, and the Linformer's eq. 7.

Capture, the methods, the Linformer layer, the calibration objective and the theorem probes all use these, so
"the softmax over the keys a query may see" means one computation everywhere:

- `scores(q, k, s)` = q kᵀ · s, (…, n, d) × (…, m, d) → (…, n, m);
- `allowed(valid, causal)`: the keys each query may see — the valid ones and, for causal attention, those at
  or before the query's position;
- `causal_mask(queries, keys)`: the causal mask of the last `queries` positions over `keys` positions;
- `masked_softmax(logits, keep)`: the softmax over the kept entries of each row, zero elsewhere; a row that
  keeps nothing (a left-padded query of a decoder) is a zero row, not NaN;
- `eager_softmax(logits, keep, dtype)`: the masked softmax as eager attention takes it — hidden entries at the
  dtype's minimum, the softmax in float32 (or wider), cast back — for the KV-cache engine and the presses, whose
  outputs must match a dense forward bit for bit;
- `window_rows(q, key, s)`: the causal attention rows of a context's last queries over its keys, grouped-query,
  as eager attention takes its softmax (what SnapKV and TOVA read of a prefill);
- `eager_p(q, k, s, mask)`: P = softmax(q kᵀ s + mask) with the model's additive mask, exactly as transformers'
  eager attention computes it (tests/test_capture.py checks the bits);
- eq. 7, softmax(Q (E K)ᵀ s)(F V): `project` (E·X along the sequence, padded rows zeroed first), `attend`
  (softmax(q k̄ᵀ s) v̄) and `eq7`, which also forms the n × n P̃ = softmax(Q (E K)ᵀ s) F when asked.
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import SpectraError


def scores(q: torch.Tensor, k: torch.Tensor, scaling: float) -> torch.Tensor:
    """The scaled scores q kᵀ · s: q (…, n, d), k (…, m, d) → (…, n, m)."""
    return torch.matmul(q, k.transpose(-1, -2)) * scaling


def allowed(valid: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Which keys each query may see: (B, 1, 1, n) from valid (B, n) — the valid keys — or, for causal attention,
    (B, 1, n, n): the valid keys at or before the query's position."""
    keep = valid[:, None, None, :]
    if causal:
        n = valid.shape[-1]
        keep = keep & causal_mask(n, n, valid.device)
    return keep


def causal_mask(queries: int, keys: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(queries, keys) booleans: query i, at position keys − queries + i, sees the keys at or before it."""
    position = torch.arange(keys - queries, keys, device=device)[:, None]
    return torch.arange(keys, device=device)[None, :] <= position


def masked_softmax(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The softmax of each row of `logits` over its kept entries (`keep` broadcasts to its shape), zero elsewhere;
    a row keeping no entry is zero (not NaN)."""
    p = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
    return torch.where(keep.any(-1, keepdim=True), p, 0.0)


def eager_softmax(logits: torch.Tensor, keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The softmax of each row of `logits` over its kept entries (`keep` broadcasts), as eager attention computes
    a masked row: hidden entries set to the dtype's minimum, the softmax taken in float32 (or wider, for float64
    logits) and cast to `dtype`."""
    logits = logits.masked_fill(~keep, torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32)).to(dtype)


def eager_p(q: torch.Tensor, k: torch.Tensor, scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """P = softmax(q kᵀ · s + mask) (B, H, n, n) with the model's additive mask (or none), the operations of
    transformers' eager attention in their order, so the bits are the same."""
    logits = scores(q, k, scaling)
    if mask is not None:
        logits = logits + mask
    return nn.functional.softmax(logits, dim=-1)


def project(x: torch.Tensor, proj: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """E·x along the sequence: x (B, H|1, n, c) and proj (budget, ≥n), (H|1, budget, ≥n) or, one per sequence,
    (B, H, budget, ≥n) → (B, H, budget, c).

    Uses the first n columns of proj (the paper's slicing rule); rows of padded positions (valid (B, n) False)
    are zeroed first, so they contribute nothing.
    """
    n = x.shape[-2]
    if proj.shape[-1] < n:
        raise SpectraError(
            f"a sequence of {n} tokens is longer than the projection's {proj.shape[-1]} columns; "
            f"use projections with max_len ≥ {n}"
        )
    proj = proj[..., :n].to(device=x.device, dtype=x.dtype)
    if valid is not None:
        x = x.masked_fill(~valid[:, None, :, None], 0.0)
    if proj.dim() == 4:
        return torch.einsum("bhcn,bhnx->bhcx", proj, x)
    proj = proj[None] if proj.dim() == 2 else proj
    heads = max(x.shape[1], proj.shape[0])  # either side may be shared across heads (size 1)
    return torch.einsum("hcn,bhnx->bhcx", proj.expand(heads, -1, -1), x.expand(-1, heads, -1, -1))


def attend(q: torch.Tensor, k_bar: torch.Tensor, v_bar: torch.Tensor, scaling: float | None = None) -> torch.Tensor:
    """softmax(q k̄ᵀ · s) v̄: q (B, H, n, d), k̄ and v̄ (B, H, budget, d) → (B, H, n, d); s defaults to 1/√d."""
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    p_bar = torch.softmax(torch.einsum("bhid,bhcd->bhic", q, k_bar) * scaling, dim=-1)  # (B, H, n, budget)
    return torch.einsum("bhic,bhcd->bhid", p_bar, v_bar)


def eq7(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, f: torch.Tensor,
        valid: torch.Tensor | None = None, scaling: float | None = None, *,
        dense: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Linformer's eq. 7, softmax(Q (E K)ᵀ s)(F V), on q, k, v (B, H, n, d) → (output (B, H, n, d), P̃).

    e, f: (budget, ≥n), (H|1, budget, ≥n) or one per sequence (B, H, budget, ≥n), sliced to the first n columns;
    valid (B, n) marks the keys that are not padding (None: all), padded keys are zeroed before projecting; s
    defaults to 1/√d. Without `dense` the output is softmax(Q (E K)ᵀ s)(F V) in O(n·budget·d) and P̃ is None;
    with it the n × n P̃ = softmax(Q (E K)ᵀ s) F (padded columns zero) is formed, for measuring, and the output
    is P̃ V (the same up to rounding; v must then be zero on padded rows or `valid` given)."""
    if not dense:
        return attend(q, project(k, e, valid), project(v, f, valid), scaling), None
    n = q.shape[-2]
    e, f = e[..., :n].to(q), f[..., :n].to(q)
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    p_bar = torch.softmax(torch.einsum("bhid,bhcd->bhic", q, project(k, e, valid)) * scaling, dim=-1)
    if valid is not None:
        f = f * valid[:, None, None, :]
    p_tilde = p_bar @ f  # (B, H, n, n)
    return p_tilde @ v, p_tilde


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager attention takes its softmax in: float32, or wider for a float64 model."""
    return torch.promote_types(dtype, torch.float32)


def window_rows(q: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """P's rows of the last w queries: q (H, w, d) post-RoPE at positions L − w … L − 1, key (H_kv, L, d) → (H, w, L),
    causal (query L − w + i sees keys ≤ L − w + i)."""
    heads, window, dim = q.shape
    kv_heads, length = key.shape[0], key.shape[1]
    scores = torch.matmul(q.reshape(kv_heads, -1, dim), key.transpose(-1, -2)).view(heads, window, length) * scaling
    hidden = torch.ones(window, window, dtype=torch.bool, device=q.device).triu(1)
    scores[..., length - window:].masked_fill_(hidden, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1, dtype=softmax_dtype(scores.dtype)).to(q.dtype)
