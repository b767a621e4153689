"""`nystrom`, `nystrom-iter6`: Nyströmformer (Xiong et al. 2021) with k segment-mean landmarks.

P̃ = softmax(Q K̃ᵀ s) A⁺ softmax(Q̃ Kᵀ s), A = softmax(Q̃ K̃ᵀ s), the landmarks Q̃, K̃ the means of Q and K
over the k pooling windows of the valid positions (as pool-mean). `nystrom` takes A⁺ exactly;
`nystrom-iter6` by 6 steps of the paper's iteration. k = n is exact. Cost O(n k d + k³) per head.

Both run in float64 whatever the captured dtype, and cast the result back. A is often ill-conditioned
(cond(A) up to 6e4 on a tiny random RoBERTa at k = 12), and in float32 the rounding of A and of its
pseudo-inverse, amplified by cond(A), moved a head's output by up to 1e-2 relative under a one-ulp change
of q, k, v (tests/methods/test_nystrom.py) and end-to-end perplexity by 1.3e-3 under a one-ulp change of
the weights. In float64 what is left is the method's own conditioning: the inputs' rounding amplified by
cond(A) (≤ 1.4e-5 there; 2e-4 on the tiny RoBERTa's head errors), which no precision removes.
`nystrom`'s pseudo-inverse keeps torch's cutoff for the captured dtype, now explicit: singular values below
k·ε·σ₁ (ε of the captured dtype, 1.2e-7 for float32) are dropped, since A is known only to that precision.
"""

from __future__ import annotations

import torch

from ..kernels import masked_softmax, scores
from .base import Approximation, Draws, Layer, Method, register
from .pooling import pool, windows

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 60


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Nyströmformer's approximation of A⁺ (…, k, k): Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))) from
    Z₀ = Aᵀ/(‖A‖₁‖A‖_∞), the norms taken per matrix (the released code takes one maximum over the whole
    batch, which would make a sequence's result depend on the others). Zero rows/columns stay zero."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norms = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)
    z = a.transpose(-1, -2) / norms[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def pinv_cutoff(budget: int, dtype: torch.dtype) -> float:
    """The relative cutoff of an exact pseudo-inverse of a k×k matrix computed from `dtype` data: singular
    (or, Hermitian, eigen-) values below k·ε·max are dropped — torch's default for pinv in that dtype, kept
    when the pseudo-inverse itself runs in float64, because the matrix is known only to `dtype`'s precision."""
    return budget * torch.finfo(dtype).eps


@register
class Nystrom(Method):
    """Nyströmformer with the pseudo-inverse exact (`iterations` None) or by `iterations` steps of
    `iterative_pinv`: `nystrom-iter6`, Nyströmformer's default number of iterations."""

    variants = {"nystrom": {"iterations": None, "color": "tab:brown", "marker": ">"},
                "nystrom-iter6": {"iterations": 6, "color": "#c49c94", "marker": "h"}}

    def __init__(self, label: str, iterations: int | None, **shown: str) -> None:
        super().__init__(label, **shown)
        self.iterations = iterations

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        """P̃ = softmax(Q K̃ᵀ s) A⁺ softmax(Q̃ Kᵀ s), A = softmax(Q̃ K̃ᵀ s), with landmarks Q̃, K̃ the means of
        Q and K over k contiguous windows of the valid positions (as pool-mean). Empty windows (k > m
        valid tokens) are masked: their landmarks get zero rows and columns, so A⁺ ignores them. Computed in
        float64 (A is ill-conditioned, see the module docstring), returned in the layer's dtype."""
        work = torch.promote_types(x.q.dtype, torch.float64)
        q, k, v = x.q.to(work), x.k.to(work), x.v.to(work)
        window = windows(x.valid, budget)
        q_tilde, k_tilde = pool(q, window, budget, "mean"), pool(k, window, budget, "mean")
        present = torch.zeros(window.shape[0], budget + 1, dtype=torch.bool, device=window.device)
        present = present.scatter(-1, window, True)[:, None, :budget]  # (B, 1, k)
        rows = present[..., None].to(work)  # zero the rows of empty landmarks
        s = x.scaling
        f = masked_softmax(scores(q, k_tilde, s), present[:, :, None, :])
        a = masked_softmax(scores(q_tilde, k_tilde, s), present[:, :, None, :]) * rows
        b = masked_softmax(scores(q_tilde, k, s), x.valid[:, None, None, :]) * rows
        if self.iterations is None:
            a_plus = torch.linalg.pinv(a, rtol=pinv_cutoff(budget, x.q.dtype))
        else:
            a_plus = iterative_pinv(a, self.iterations)
        out = f @ (a_plus @ (b @ v))
        return Approximation(out.to(x.q.dtype), (f @ a_plus @ b).to(x.q.dtype))
