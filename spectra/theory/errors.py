"""The theorems' dense error formulas: the quantities Theorems 1 and 2 bound, computed on given P, V, R.

- Theorem 1's P̃ = P RᵀR, measured per column w of V as ‖P̃ w − P w‖/‖P w‖ (P̃ never formed);
- the best rank-k approximation P_k (truncated SVD), the reference floor: Eckart–Young makes ‖P − P_k‖
  minimal over all rank-k matrices in Frobenius and spectral norm. Per column w of V that is not
  strictly a floor: for a given w another rank-k matrix, P Rᵀ R included, can do better;
- Theorem 2's softmax(w Eᵀ) F V with E = δR, F = e^{−δ}R against softmax(w) V per row w, relative to
  the theorem's right side ‖softmax(w)‖₂ ‖V‖_F (the Frobenius norm: a column-by-column JL argument, the
  proof's tool, bounds the error by ε‖softmax(w)‖ ‖V‖_F; the spectral norm would make errors larger)
  and to ‖softmax(w) V‖.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import SpectraError
from ..kernels import masked_softmax


def as_float(x: torch.Tensor) -> torch.Tensor:
    """x in float32 or better (the errors are computed there whatever the forward pass's dtype)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _heads(r: torch.Tensor, n: int) -> torch.Tensor:
    """R as (H or 1, budget, n): sliced to the first n columns."""
    if r.shape[-1] < n:
        raise SpectraError(f"R has {r.shape[-1]} columns but the sequence has {n}; draw R with n ≥ {n}")
    r = r[..., :n]
    return r[None] if r.dim() == 2 else r


def _tiny(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(torch.finfo(x.dtype).tiny)


def jl_inner_errors(x: torch.Tensor, y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """|x Rᵀ R yᵀ − x yᵀ| / (‖x‖ ‖y‖): the JL lemma's quantity; x, y (…, n), R (…, budget, n), broadcast."""
    rx, ry = (r @ x[..., None])[..., 0], (r @ y[..., None])[..., 0]
    return ((rx * ry).sum(-1) - (x * y).sum(-1)).abs() / _tiny(x.norm(dim=-1) * y.norm(dim=-1))


def theorem1_errors(p: torch.Tensor, v: torch.Tensor, r: torch.Tensor, *, rows: bool = False) -> torch.Tensor:
    """‖P̃ w − P w‖ / ‖P w‖ for every column w of v, P̃ = P Rᵀ R: p (B, H, n, n), v (B, H, n, d) → (B, H, d).

    r: (budget, ≥n) or (H, budget, ≥n), sliced to n columns. P̃ is never formed: P̃ w − P w = P (RᵀR w − w).
    Mask padding beforehand (zero P's padded rows/columns and V's padded rows).

    With `rows`, the error in the form the proof bounds instead: the JL lemma applied to each row P_i of P
    bounds each entry, |(P̃ w − P w)_i| ≤ ε ‖P_i‖ ‖w‖, so this returns max_i |(P̃ w − P w)_i| / (‖P_i‖ ‖w‖)
    over the rows (padded rows, whose P_i is zero, count as zero).
    """
    r = _heads(r, v.shape[-2]).to(device=v.device, dtype=v.dtype)
    heads = max(r.shape[0], v.shape[1])
    r = r.expand(heads, -1, -1)
    back = torch.einsum("hcj,bhcd->bhjd", r, torch.einsum("hcj,bhjd->bhcd", r, v))  # Rᵀ R V
    diff = p @ (back - v)
    if rows:
        scale = p.norm(dim=-1, keepdim=True) * v.norm(dim=-2, keepdim=True)  # ‖P_i‖ ‖w‖ (B, H, n, d)
        return torch.where(scale > 0, diff.abs() / _tiny(scale), 0.0).amax(dim=-2)
    return diff.norm(dim=-2) / _tiny((p @ v).norm(dim=-2))


def best_rank_errors(p: torch.Tensor, v: torch.Tensor, budgets: Sequence[int]) -> torch.Tensor:
    """‖P_k w − P w‖ / ‖P w‖ with P_k the truncated SVD of rank k (Eckart–Young): → (K, B, H, d).

    With P = U Σ Vᵀ and y = Σ Vᵀ w, ‖P_k w − P w‖² = Σ_{i>k} y_i², so one SVD serves the whole sweep.
    """
    _, sigma, vh = torch.linalg.svd(p, full_matrices=False)
    y2 = (sigma[..., None] * (vh @ v)) ** 2  # (B, H, n, d)
    tail = y2.flip(-2).cumsum(-2).flip(-2)  # tail[i] = Σ_{j≥i} y_j²
    tail = torch.cat([tail, torch.zeros_like(tail[..., :1, :])], dim=-2)
    index = torch.tensor([min(budget, p.shape[-1]) for budget in budgets], device=p.device)
    return (tail.index_select(-2, index).movedim(-2, 0) / _tiny(tail[..., 0, :])).sqrt()


def theorem2_errors(
    a: torch.Tensor,
    v: torch.Tensor,
    r: torch.Tensor,
    deltas: Sequence[float | torch.Tensor],
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Theorem 2's errors of softmax(w Eᵀ) F V against softmax(w) V, E = δR, F = e^{−δ}R, per row w of a.

    a: scores Q Kᵀ/√d (B, H, n, n) without mask; v (B, H, n, d); r (budget, ≥n) or (H, budget, ≥n);
    deltas: each a float or one value per sequence (B,); valid (B, n) marks real keys (padded ones are
    dropped from w and V). Returns the row errors (len(deltas), B, H, n) relative to ‖softmax(w)‖₂ ‖V‖_F
    and relative to ‖softmax(w) V‖. w Rᵀ and R V are computed once for all δ.
    """
    batch, heads, n, _ = a.shape
    valid = torch.ones(batch, n, dtype=torch.bool, device=a.device) if valid is None else valid
    keys = valid[:, None, None, :]
    v = v * valid[:, None, :, None].to(v.dtype)
    p = masked_softmax(a, keys)
    exact = p @ v
    r = _heads(r, n).to(device=a.device, dtype=a.dtype).expand(heads, -1, -1)
    s = torch.einsum("bhij,hcj->bhic", a.masked_fill(~keys, 0.0), r)  # w Rᵀ (B, H, n, budget)
    rv = torch.einsum("hcj,bhjd->bhcd", r, v)  # R V (B, H, budget, d)
    rhs = _tiny(p.norm(dim=-1) * v.flatten(-2).norm(dim=-1)[..., None])
    out = _tiny(exact.norm(dim=-1))
    errors = []
    for delta in deltas:
        delta = torch.as_tensor(delta, dtype=torch.float64, device=a.device).expand(batch)
        delta = delta.to(a.dtype)[:, None, None, None]  # float32: δ < ~1e-45 is 0, the δ → 0 limit
        approx = torch.softmax(delta * s, dim=-1) @ (torch.exp(-delta) * rv)
        errors.append((approx - exact).norm(dim=-1))
    err = torch.stack(errors)
    return err / rhs, err / out
