"""What a head does, read off its attention: per-sequence scores of P that name sink, previous-token, local,
induction and retrieval heads (`spectra heads`).

All scores are per sequence and head, from P (B, H, n, n) with padded rows and columns zero and `valid` (B, n)
marking the real tokens (contiguous: padding sits on one side). Positions are counted among the valid tokens
(rank 0 is the first valid token). The per-query scores average over the same queries as the existing sink mass
(`spectrum.row_metrics`): the valid queries from `spectrum.sink_start(n)` on (16, or n/8 for short sequences),
because the first rows see only a few keys and any key is a large share of them.

- `sink_share`: the share of those queries whose attention on the first token exceeds ε (Gu et al. 2024 count
  a sink with ε = 0.3); `sink_mean` (the mean of P[i, 0], same queries) is `spectrum.row_metrics`' sink.
- `prev`: the mean of P[i, i−1], the previous-token score.
- `local`: the mean over queries of Σ_{|i−j| < window} P[i, j], the mass within `window` tokens (for a decoder
  the last `window` keys, the query itself included).
- `top10`: the mean over queries of the summed largest ⌈m_i/10⌉ entries of row i, m_i the keys query i may see
  (i+1 for a decoder, m for an encoder): H2O's heavy-hitter mass.
- `keynorm_corr`: Pearson's correlation over the valid keys of ‖k_j‖ (the key the attention function receives,
  after any rotary encoding) with the attention key j receives per query that may see it (Σ_i P[i, j] / #{i
  that see j}; a decoder's early keys are seen by more queries); 0 when either is constant.
- `retrieval`: ‖ΔO‖_F / ‖O‖_F, O the layer's attention output (heads concatenated through W^O, bias included)
  and ΔO its change when this head alone attends only to the first `sinks` and the `recent` nearest keys
  (|i − j| < recent; for a decoder the last `recent` keys, as DuoAttention's streaming heads; for an encoder the
  bidirectional analogue), its row of P renormalised over them — DuoAttention's question (does this head need the
  whole context?) answered on the layer output, without training gates.
- `induction_score`: TransformerLens's protocol, decoders only (see `induction_stripe`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..spectrum import query_rows

#: the per-sequence scores a batch gives, in table order
ROW_SCORES = ("sink_share", "prev", "local", "top10", "keynorm_corr")
#: TransformerLens's induction protocol: random tokens repeated twice, in this many seeded sequences
INDUCTION_TOKENS, INDUCTION_SEQUENCES = 50, 4


def positions(valid: torch.Tensor) -> torch.Tensor:
    """Each token's rank among the valid tokens (B, n); padded positions get −1."""
    rank = valid.long().cumsum(-1) - 1
    return torch.where(valid, rank, -1)


def _row_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean over the chosen rows (B, n) of values (B, H, n), float64."""
    weight = rows[:, None, :].to(torch.float64)
    return (values.to(torch.float64) * weight).sum(-1) / weight.sum(-1).clamp_min(1)


def visible(valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """Which key j query i may see (B, n, n): both valid, and j ≤ i for a decoder."""
    both = valid[:, :, None] & valid[:, None, :]
    if causal:
        rank = positions(valid)
        both &= rank[:, None, :] <= rank[:, :, None]
    return both


def row_scores(p: torch.Tensor, key: torch.Tensor, valid: torch.Tensor, causal: bool, start: int, eps: float,
               window: int) -> torch.Tensor:
    """ROW_SCORES (B, H, 5), float64, of P (B, H, n, n); `key` (B, H, n, d) holds each query head's keys."""
    batch, heads, n, _ = p.shape
    rows = query_rows(valid, start)
    rank = positions(valid)
    first = valid.long().argmax(-1)
    to_first = torch.gather(p, -1, first[:, None, None, None].expand(batch, heads, n, 1))[..., 0]
    sink_share = _row_mean((to_first > eps).to(torch.float64), rows)
    offset = rank[:, :, None] - rank[:, None, :]  # (B, i, j): how far key j lies behind query i
    pair = valid[:, :, None] & valid[:, None, :]
    prev = _row_mean((p * ((offset == 1) & pair)[:, None]).sum(-1), rows)
    local = _row_mean((p * ((offset.abs() < window) & pair)[:, None]).sum(-1), rows)
    sees = visible(valid, causal)
    count = sees.sum(-1)  # (B, n): keys each query may see
    top = torch.clamp((count + 9) // 10, min=1)  # ⌈m/10⌉
    ordered = torch.sort(p, dim=-1, descending=True).values.cumsum(-1)
    top10 = _row_mean(torch.gather(ordered, -1, (top - 1)[:, None, :, None].expand(batch, heads, n, 1))[..., 0], rows)
    return torch.stack([sink_share, prev, local, top10, keynorm_correlation(p, key, valid, causal)], dim=-1)


def keynorm_correlation(p: torch.Tensor, key: torch.Tensor, valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """Pearson's correlation over valid keys of ‖k_j‖ with the attention j receives per query that sees it (B, H);
    0 where either is constant."""
    sees = visible(valid, causal).to(torch.float64)  # (B, i, j)
    seen_by = sees.sum(1)  # (B, j)
    received = (p.to(torch.float64) * sees[:, None]).sum(-2) / seen_by[:, None].clamp_min(1)  # (B, H, j)
    norms = key.to(torch.float64).norm(dim=-1)  # (B, H, n)
    weight = valid[:, None, :].to(torch.float64)
    count = weight.sum(-1, keepdim=True).clamp_min(1)
    a = received - (received * weight).sum(-1, keepdim=True) / count
    b = norms - (norms * weight).sum(-1, keepdim=True) / count
    a, b = a * weight, b * weight
    scale = a.norm(dim=-1) * b.norm(dim=-1)
    tiny = torch.finfo(torch.float64).tiny
    return torch.where(scale > tiny, (a * b).sum(-1) / scale.clamp_min(tiny), 0.0)


def streaming_keys(valid: torch.Tensor, sinks: int, recent: int) -> torch.Tensor:
    """Which key j a streaming head lets query i keep (B, n, n): valid, and among the first `sinks` valid tokens or
    within `recent` positions of the query (|i − j| < recent; a decoder's P is zero past the query anyway)."""
    rank = positions(valid)
    near = (rank[:, :, None] - rank[:, None, :]).abs() < recent
    sink = (rank < sinks)[:, None, :]
    return valid[:, :, None] & valid[:, None, :] & (near | sink)


def streaming_p(p: torch.Tensor, valid: torch.Tensor, sinks: int, recent: int) -> torch.Tensor:
    """P restricted to a streaming head's keys and renormalised per row: the softmax over those keys alone."""
    kept = p * streaming_keys(valid, sinks, recent)[:, None].to(p.dtype)
    return kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)


def retrieval_scores(p: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, w_o: torch.Tensor,
                     b_o: torch.Tensor | None, sinks: int, recent: int) -> torch.Tensor:
    """`retrieval` (B, H), float64: ‖ΔO_h‖_F / ‖O‖_F over valid rows, where O = concat_h(P_h V_h) W_Oᵀ + b_O (B, n, D)
    and ΔO_h = ((P'_h − P_h) V_h) W_O,hᵀ, P'_h the streaming restriction of head h alone and W_O,h = W_O[:, h·d:(h+1)·d]
    its columns. `v` (B, H, n, d) holds each query head's values; w_o (D, H·d)."""
    batch, heads, n, d = v.shape
    p64, v64, w = p.to(torch.float64), v.to(torch.float64), w_o.to(torch.float64)
    rows = valid[:, :, None].to(torch.float64)
    heads_out = (p64 @ v64).transpose(1, 2).reshape(batch, n, heads * d)
    out = heads_out @ w.T + (0.0 if b_o is None else b_o.to(torch.float64))
    total = (out * rows).flatten(1).norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    change = (streaming_p(p64, valid, sinks, recent) - p64) @ v64  # (B, H, n, d)
    scores = []
    for head in range(heads):
        moved = change[:, head] @ w[:, head * d:(head + 1) * d].T  # (B, n, D)
        scores.append((moved * rows).flatten(1).norm(dim=-1) / total)
    return torch.stack(scores, dim=-1)


def induction_tokens(vocab: int, exclude: list[int], bos: int | None, seed: int) -> np.ndarray:
    """INDUCTION_SEQUENCES sequences (S, [1 +] 2·INDUCTION_TOKENS) of INDUCTION_TOKENS token ids drawn uniformly (seeded)
    from the vocabulary without `exclude` (special tokens), repeated twice, after `bos` when the model has one."""
    allowed = np.setdiff1d(np.arange(vocab), np.asarray(exclude, dtype=np.int64))
    drawn = np.random.default_rng(seed).choice(allowed, size=(INDUCTION_SEQUENCES, INDUCTION_TOKENS))
    tokens = np.concatenate([drawn, drawn], axis=1)
    if bos is not None:
        tokens = np.concatenate([np.full((INDUCTION_SEQUENCES, 1), bos), tokens], axis=1)
    return tokens


def induction_stripe(p: torch.Tensor, offset: int) -> torch.Tensor:
    """The induction score (B, H) of P (B, H, n, n) on a random block repeated twice starting at `offset` (1 after a
    BOS): the mean over the second copy's tokens i of P[i, i − L + 1], L = INDUCTION_TOKENS — the attention from
    each repeated token to the token that followed its first occurrence. (TransformerLens's diagonal at offset
    1 − L also takes in the first copy's last token and the one before; this takes the second copy only.)"""
    length = INDUCTION_TOKENS
    queries = torch.arange(offset + length, offset + 2 * length, device=p.device)
    keys = queries - length + 1
    return p[..., queries, keys].to(torch.float64).mean(-1)


def energy_rank(sigma: np.ndarray, energy: float = 0.9) -> np.ndarray:
    """Smallest r with Σ_{i≤r} σ_i ≥ energy·Σσ (descending σ along the last axis): rank90 as `spectrum.summarize`
    counts it for P, on the normalized cumulative curve; 0 for a zero matrix."""
    total = np.cumsum(sigma, axis=-1)
    cum = total / np.maximum(total[..., -1:], np.finfo(float).tiny)
    return np.where(total[..., -1] > 0, (cum < energy).sum(-1) + 1, 0)

