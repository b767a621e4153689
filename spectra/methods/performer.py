"""`performer`: FAVOR+ (Choromanski et al. 2021) with k positive orthogonal random features.

P̃ = D̂⁻¹ φ(Q) φ(K)ᵀ with φ(x) = exp(W x − ‖x‖²/2)/√m on √s q and √s k (s the model's score scale, m = k
features), so φ(q)·φ(k) is an unbiased estimate of exp(s q·k). W is seeded per (seed, budget, layer,
head). Padded keys get φ = 0. Cost O(n k d) per head.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from ..seeds import Domain, derive_seed
from .base import Approximation, Layer, method


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


def performer_features(x: Layer, budget: int) -> torch.Tensor:
    """The seeded W (H, m = k, d) of each head, fixed by (seed, budget, layer, head)."""
    w = _performer_w(x.seed, budget, x.layer, x.q.shape[1], x.q.shape[-1])
    return torch.tensor(w, device=x.q.device, dtype=x.q.dtype)  # a copy: the cached array stays intact


def log_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """log φ(x) (B, H, n, m) = W x − ‖x‖²/2 − ½ log m for x (B, H, n, d), W (H, m, d):
    E_W[φ(x)·φ(y)] = exp(x·y) (positive random features, Lemma 1 of the paper)."""
    return (torch.einsum("bhnd,hmd->bhnm", x, w) - x.square().sum(-1, keepdim=True) / 2
            - 0.5 * math.log(w.shape[-2]))


@method("performer", color="tab:red", marker="<")
def performer(x: Layer, budget: int) -> Approximation:
    """FAVOR+: Ṽ = D̂⁻¹ φ(Q)(φ(K)ᵀ V), D̂ = diag(φ(Q) φ(K)ᵀ 1), on √s·q and √s·k so that
    φ(q)·φ(k) is an unbiased estimate of exp(s q·k); padded keys get φ = 0.

    No additive stabiliser ε. For float safety each query's features are divided by their largest
    entry, and all keys' features of one (sequence, head) by one common largest entry: both factors
    cancel exactly in D̂⁻¹ φ(Q) φ(K)ᵀ. (A per-key shift would not cancel: it would reweight the keys.)
    D̂ is kept above the dtype's tiny, so a query whose estimate underflows gets a zero row, not NaN.
    """
    w, root = performer_features(x, budget), math.sqrt(x.scaling)
    log_q, log_k = log_features(x.q * root, w), log_features(x.k * root, w)
    phi_q = torch.exp(log_q - log_q.amax(-1, keepdim=True))  # (B, H, n, m), a factor per query
    log_k = log_k.masked_fill(~x.valid[:, None, :, None], float("-inf"))
    phi_k = torch.exp(log_k - log_k.amax((-2, -1), keepdim=True))  # one factor per (sequence, head)
    d_hat = torch.einsum("bhim,bhm->bhi", phi_q, phi_k.sum(-2)).clamp_min(torch.finfo(x.q.dtype).tiny)
    out = torch.einsum("bhim,bhme->bhie", phi_q, torch.einsum("bhjm,bhje->bhme", phi_k, x.v)) / d_hat[..., None]
    p_tilde = torch.einsum("bhim,bhjm->bhij", phi_q, phi_k) / d_hat[..., None]
    return Approximation(out, p_tilde)
