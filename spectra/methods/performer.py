"""`performer`: FAVOR+ (Choromanski et al. 2021) with k positive orthogonal random features.

P̃ = D̂⁻¹ φ(Q) φ(K)ᵀ with φ(x) = exp(W x − ‖x‖²/2)/√m on √s q and √s k (s the model's score scale, m = k
features), so φ(q)·φ(k) is an unbiased estimate of exp(s q·k). W is seeded per (seed, budget, layer,
head); `favor_plus` computes the same from q, k, v and a given W (to reproduce another implementation's
draw). Padded keys get φ = 0. Cost O(n k d) per head.

`performer-causal`: the same features (the same W for the same seed, budget, layer and head), each query
summing over the valid keys at or before it only — the prefix sums Σ_{j≤i} φ(k_j) v_jᵀ and Σ_{j≤i} φ(k_j)
of unidirectional FAVOR+, carried over positions. Cost O(n k d) per head.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from ..seeds import Domain, derive_seed
from .base import Approximation, Draws, Layer, Method, one_by_one, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 50


def orthogonal_features(m: int, d: int, seed: int) -> np.ndarray:
    """W (m, d): stacked d×d blocks of Haar-orthonormal rows, each row rescaled by an independent
    χ_d-distributed norm, so every row is marginally N(0, I_d) (FAVOR+'s orthogonal random features)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(math.ceil(m / d)):
        basis, upper = np.linalg.qr(rng.standard_normal((d, d)))
        blocks.append((basis * np.sign(np.diag(upper))).T)  # sign fix: Haar-distributed rows
    norms = np.linalg.norm(rng.standard_normal((m, d)), axis=1)
    return np.concatenate(blocks)[:m] * norms[:, None]


@lru_cache(maxsize=256)
def _performer_w(seed: int, budget: int, layer: int, heads: int, d: int) -> np.ndarray:
    return np.stack([orthogonal_features(budget, d, derive_seed(seed, Domain.PERFORMER, budget, layer, head))
                     for head in range(heads)])


def performer_features(x: Layer, budget: int, draws: Draws) -> torch.Tensor:
    """The seeded W (H, m = k, d) of each head, fixed by (seed, budget, layer, head); a sequence that draws its own
    (one at a time, `one_by_one`) derives the seed with its global index."""
    seed = draws.seeds(Domain.PERFORMER)[0] if draws.per_sequence else draws.seed
    w = _performer_w(seed, budget, x.layer, x.q.shape[1], x.q.shape[-1])
    return torch.tensor(w, device=x.q.device, dtype=x.q.dtype)  # a copy: the cached array stays intact


def log_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """log φ(x) (B, H, n, m) = W x − ‖x‖²/2 − ½ log m for x (B, H, n, d), W (H, m, d):
    E_W[φ(x)·φ(y)] = exp(x·y) (positive random features, Lemma 1 of the paper)."""
    return (torch.einsum("bhnd,hmd->bhnm", x, w) - x.square().sum(-1, keepdim=True) / 2
            - 0.5 * math.log(w.shape[-2]))


def favor_plus(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, scaling: float,
               w: torch.Tensor) -> Approximation:
    """FAVOR+ with given random features W (H, m, d): Ṽ = D̂⁻¹ φ(Q)(φ(K)ᵀ V), D̂ = diag(φ(Q) φ(K)ᵀ 1), on
    √s·q and √s·k so that φ(q)·φ(k) is an unbiased estimate of exp(s q·k) when the rows of W are N(0, I_d).

    q, k, v (B, H, n, d); valid (B, n) marks the keys that are not padding (they get φ = 0); `scaling` is s.
    Pass another implementation's W to reproduce its draw; the `performer` method passes its seeded one.

    No additive stabiliser ε. For float safety each query's features are divided by their largest
    entry, and all keys' features of one (sequence, head) by one common largest entry: both factors
    cancel exactly in D̂⁻¹ φ(Q) φ(K)ᵀ. (A per-key shift would not cancel: it would reweight the keys.)
    D̂ is kept above the dtype's tiny, so a query whose estimate underflows gets a zero row, not NaN.
    """
    w, root = w.to(q), math.sqrt(scaling)
    log_q, log_k = log_features(q * root, w), log_features(k * root, w)
    phi_q = torch.exp(log_q - log_q.amax(-1, keepdim=True))  # (B, H, n, m), a factor per query
    log_k = log_k.masked_fill(~valid[:, None, :, None], float("-inf"))
    phi_k = torch.exp(log_k - log_k.amax((-2, -1), keepdim=True))  # one factor per (sequence, head)
    d_hat = torch.einsum("bhim,bhm->bhi", phi_q, phi_k.sum(-2)).clamp_min(torch.finfo(q.dtype).tiny)
    out = torch.einsum("bhim,bhme->bhie", phi_q, torch.einsum("bhjm,bhje->bhme", phi_k, v)) / d_hat[..., None]
    p_tilde = torch.einsum("bhim,bhjm->bhij", phi_q, phi_k) / d_hat[..., None]
    return Approximation(out, p_tilde)


def favor(x: Layer, budget: int, draws: Draws) -> Approximation:
    """FAVOR+ (`favor_plus`) with the seeded features of `performer_features`: m = k per head."""
    return favor_plus(x.q, x.k, x.v, x.valid, x.scaling, performer_features(x, budget, draws))


#: positions per block of `performer-causal`'s prefix sums: the running sums are carried from block to block,
#: within a block each query sums over the keys at or before it directly (the chunked form of causal
#: linear attention; the block length changes only the rounding)
CAUSAL_BLOCK = 64


def causal_key_scale(log_k: torch.Tensor) -> torch.Tensor:
    """c_i (B, H, n): the largest log-feature of the valid keys at or before position i (a running max), the
    float-safety factor exp(−c_i) shared by all the keys row i sums over. Before the first valid key it is
    that key's; a sequence without valid keys gets 0."""
    c = log_k.amax(-1).cummax(-1).values  # −inf up to the first valid key
    first = torch.where(torch.isfinite(c), c, float("inf")).amin(-1, keepdim=True)  # c is nondecreasing
    c = torch.maximum(c, first)
    return torch.where(torch.isfinite(c), c, 0.0)


def causal_favor(x: Layer, budget: int, draws: Draws) -> Approximation:
    """Causal FAVOR+: Ṽ_i = φ(q_i)ᵀ Σ_{j≤i} φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_{j≤i} φ(k_j) over valid keys, with the
    same W as `performer`; P̃ = the lower-triangular φ(Q) φ(K)ᵀ row-normalised.

    Float safety as `performer`, with factors that cancel exactly and never look ahead: each query's
    features are divided by their largest entry, and the features of the keys row i sums over by exp(c_i),
    c_i the largest log-feature of the valid keys at or before i (`causal_key_scale`; performer's single factor
    per sequence would depend on later keys, and a large later key would underflow an early row to zero).
    Row i's prefix sums are carried as Σ_{j≤i} f_j v_jᵀ e^{c_j − c_i} with f_j = e^{log φ(k_j) − c_j} ≤ 1:
    every exponent is ≤ 0. They are evaluated in blocks of `CAUSAL_BLOCK` positions — the sums of the
    earlier blocks carried as a state (rescaled as c grows), the keys of the query's own block summed
    directly — and P̃ is formed densely only for measurement.
    """
    w, root = performer_features(x, budget, draws), math.sqrt(x.scaling)
    log_q, log_k = log_features(x.q * root, w), log_features(x.k * root, w)
    phi_q = torch.exp(log_q - log_q.amax(-1, keepdim=True))  # (B, H, n, m), a factor per query
    log_k = log_k.masked_fill(~x.valid[:, None, :, None], float("-inf"))
    c = causal_key_scale(log_k)  # (B, H, n)
    f = torch.exp(log_k - c[..., None])  # (B, H, n, m), ≤ 1, 0 on padded keys
    tiny = torch.finfo(x.q.dtype).tiny

    def weights(rows: slice, cols: slice) -> torch.Tensor:
        """φ̃(q_i)·f_j e^{c_j − c_i} for queries `rows` and keys `cols`, zero where j > i."""
        i = torch.arange(rows.start, rows.stop, device=x.q.device)[:, None]
        j = torch.arange(cols.start, cols.stop, device=x.q.device)[None, :]
        exponent = (c[..., None, cols] - c[..., rows, None]).masked_fill(j > i, float("-inf"))
        return torch.einsum("bhim,bhjm->bhij", phi_q[..., rows, :], f[..., cols, :]) * exponent.exp()

    n = x.q.shape[-2]
    state = x.v.new_zeros(*f.shape[:-2], f.shape[-1], x.v.shape[-1])  # Σ_{j<start} f_j v_jᵀ e^{c_j − c_last}
    norm = f.new_zeros(*f.shape[:-2], f.shape[-1])  # Σ_{j<start} f_j e^{c_j − c_last}
    last = c[..., :1]  # c at the end of the carried sums (any value while they are 0)
    outs = []
    for start in range(0, n, CAUSAL_BLOCK):
        block = slice(start, min(start + CAUSAL_BLOCK, n))
        decay = torch.exp(last - c[..., block])[..., None]  # (B, H, L, 1), ≤ 1
        a = weights(block, block)  # (B, H, L, L)
        numerator = torch.einsum("bhim,bhme->bhie", phi_q[..., block, :], state) * decay + a @ x.v[..., block, :]
        denominator = torch.einsum("bhim,bhm->bhi", phi_q[..., block, :], norm)[..., None] * decay
        denominator = denominator + a.sum(-1, keepdim=True)
        outs.append(numerator / denominator.clamp_min(tiny))
        end = c[..., block.stop - 1:block.stop]  # (B, H, 1)
        carried = torch.exp(last - end)
        f_end = f[..., block, :] * torch.exp(c[..., block] - end)[..., None]  # (B, H, L, m)
        state = state * carried[..., None] + torch.einsum("bhjm,bhje->bhme", f_end, x.v[..., block, :])
        norm = norm * carried + f_end.sum(-2)
        last = end
    a = weights(slice(0, n), slice(0, n))  # (B, H, n, n), for measurement only
    p_tilde = a / a.sum(-1, keepdim=True).clamp_min(tiny)
    return Approximation(torch.cat(outs, dim=-2), p_tilde)


@register
class Performer(Method):
    """FAVOR+ with k random features per head (`favor`), or with `causal` its prefix-sum form (`causal_favor`) on a
    decoder's layer; on a bidirectional layer every query may see every valid key and the causal variant is
    `performer`. Each sequence draws its own features unless the draws are fixed."""

    random = True
    variants = {"performer": {"causal": False, "color": "tab:red", "marker": "<"},
                "performer-causal": {"causal": True, "color": "#ff9896", "marker": "x", "short": "perf\ncausal"}}

    def __init__(self, label: str, *, causal: bool, **shown: str) -> None:
        super().__init__(label, **shown)
        self.causal = causal

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        if draws.per_sequence and x.q.shape[0] > 1:
            return one_by_one(self, x, budget, draws)
        return (causal_favor if self.causal and x.causal else favor)(x, budget, draws)
