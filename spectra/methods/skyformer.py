"""`skyformer`: Skyformer's Nyström approximation of the Gaussian kernel (Chen et al. 2021), reweighted into softmax.

P̃ = D̃⁻¹ κ(Q, L) κ(L, L)⁺ κ(L, K) diag(exp(s‖k_j‖²/2)) with κ(x, y) = exp(−s‖x − y‖²/2) and k landmarks L
sampled half from the queries, half from the keys. Exact when every query and key is a landmark.
Cost O(n k d + k³) per head.

The kernels, the pseudo-inverse and the normaliser run in float64 whatever the captured dtype, and the
result is cast back. In float32 the rounding error of κ(L, L)⁺ (≈ ε·‖κ(Q, L)‖, though κ(L, L) is well
conditioned) is multiplied by the largest key-weighted landmark sums Σ_j κ(l, k_j) w_j, which w = exp(s‖k‖²/2)
spreads over many orders of magnitude, while a query's own D̃ can be orders smaller: a query that is itself
a landmark, whose exact D̃ was 1.5e-8 beside a landmark sum of 1.8, got D̃ = 1.6e-7, and head errors moved
by up to 9× under a one-ulp change of q, k, v. In float64 what is left is the method's own sensitivity: a
row whose D̃ nearly cancels (Σ|terms|/|D̃| ≈ 1e3) moves by ~1e3 times its inputs' rounding.
"""

from __future__ import annotations

import numpy as np
import torch

from ..seeds import Domain, derive_seed
from .base import Approximation, Draws, Layer, Method, register, valid_first
from .nystrom import pinv_cutoff

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 70


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor, scaling: float) -> torch.Tensor:
    """κ(x, y) = exp(−s‖x − y‖²/2) for x (…, n, d), y (…, c, d) → (…, n, c)."""
    distance = (x.square().sum(-1)[..., :, None] + y.square().sum(-1)[..., None, :]
                - 2 * torch.einsum("...nd,...cd->...nc", x, y)).clamp_min(0)
    return torch.exp(-scaling * distance / 2)


def skyformer_landmarks(x: Layer, budget: int, draws: Draws) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (B, H, k) of the landmarks and their mask (B, 1, k): the first ⌈k/2⌉ index queries and
    the other ⌊k/2⌋ keys, each a seeded uniform sample without replacement of the valid positions (as
    Skyformer samples half from Q, half from K); a sequence with fewer than ⌈k/2⌉ valid tokens takes them
    all and masks the rest. Each sequence draws its own sample, seeded by (seed, budget, layer, head, m, its
    global index), so it gets the same landmarks alone or in any batch; with fixed draws every sequence of
    length m shares one sample, fixed by (seed, budget, layer, head, m)."""
    batch, heads = x.valid.shape[0], x.q.shape[1]
    halves = (budget - budget // 2, budget // 2)
    ranks = np.zeros((batch, heads, budget), dtype=np.int64)
    present = np.zeros((batch, 1, budget), dtype=bool)
    lengths = x.valid.sum(-1).tolist()
    for m in set(lengths):
        rows = [b for b, length in enumerate(lengths) if length == m]
        groups = [([b], (draws.index[b],)) for b in rows] if draws.per_sequence else [(rows, ())]
        for group, sequence in groups:
            for head in range(heads):
                rng = np.random.default_rng(derive_seed(draws.seed, Domain.SKYFORMER, budget, x.layer, head, m, *sequence))
                start = 0
                for half in halves:
                    chosen = rng.permutation(m)[:half]
                    ranks[group, head, start:start + len(chosen)] = chosen
                    present[group, 0, start:start + len(chosen)] = True
                    start += half
    ranks_t = torch.from_numpy(ranks).to(x.valid.device)
    positions = torch.gather(valid_first(x.valid)[:, None, :].expand(-1, heads, -1), -1, ranks_t)
    return positions, torch.from_numpy(present).to(x.valid.device)


@register
class Skyformer(Method):
    """Skyformer's Nyström of the Gaussian kernel with k sampled landmarks, reweighted into softmax attention."""

    random = True
    variants = {"skyformer": {"color": "tab:gray", "marker": "p"}}

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        """Skyformer's Nyström of the Gaussian kernel, reweighted into softmax attention.

        exp(s q·k) = exp(s‖q‖²/2) κ(q, k) exp(s‖k‖²/2) with κ(q, k) = exp(−s‖q − k‖²/2), and the query
        factor cancels in the row normalisation, so P = D⁻¹ κ(Q, K) diag(w), w_j = exp(s‖k_j‖²/2) over
        valid keys. Nyström over the joint set [Q; K] with landmarks L (`skyformer_landmarks`) gives
        κ(Q, K) ≈ κ(Q, L) κ(L, L)⁺ κ(L, K), exact pseudo-inverse, no regulariser; then
        P̃ = D̃⁻¹ κ(Q, L) κ(L, L)⁺ κ(L, K) diag(w) with D̃ = P̃'s unnormalised row sums. w is divided by its
        largest entry (a common factor that cancels). Nyström entries may be negative, so D̃ can be ≈ 0 or
        negative for a query far from every landmark; |D̃| is only kept above the captured dtype's tiny.
        Computed in float64 (see the module docstring), with the pseudo-inverse's cutoff explicit
        (`nystrom.pinv_cutoff`: eigenvalues below k·ε·λ_max, ε of the captured dtype), returned in the layer's dtype.
        """
        positions, present = skyformer_landmarks(x, budget, draws)
        half = budget - budget // 2
        index = positions[..., None].expand(-1, -1, -1, x.q.shape[-1])
        landmarks = torch.cat([torch.gather(x.q, -2, index[:, :, :half]), torch.gather(x.k, -2, index[:, :, half:])], -2)
        work = torch.promote_types(x.q.dtype, torch.float64)
        q, k, v, landmarks = (t.to(work) for t in (x.q, x.k, x.v, landmarks))
        keep = present.to(work)  # (B, 1, k)
        s = x.scaling
        kernel_ql = gaussian_kernel(q, landmarks, s) * keep[..., None, :]  # (B, H, n, k)
        kernel_ll = gaussian_kernel(landmarks, landmarks, s) * keep[..., None, :] * keep[..., :, None]
        kernel_lk = gaussian_kernel(landmarks, k, s) * keep[..., :, None]  # (B, H, k, n)
        norms = (s * k.square().sum(-1) / 2).masked_fill(~x.valid[:, None, :], float("-inf"))
        w = torch.exp(norms - norms.amax(-1, keepdim=True))  # (B, H, n), 0 on padded keys
        kernel_lk_w = kernel_lk * w[..., None, :]
        inverse = torch.linalg.pinv(kernel_ll, hermitian=True, rtol=pinv_cutoff(budget, x.q.dtype))
        middle = kernel_ql @ inverse  # (B, H, n, k)
        d_tilde = middle @ kernel_lk_w.sum(-1, keepdim=True)  # (B, H, n, 1)
        tiny = torch.finfo(x.q.dtype).tiny
        d_tilde = torch.where(d_tilde < 0, d_tilde.clamp_max(-tiny), d_tilde.clamp_min(tiny))
        out = middle @ (kernel_lk_w @ v) / d_tilde
        return Approximation(out.to(x.q.dtype), (middle @ kernel_lk_w / d_tilde).to(x.q.dtype))
