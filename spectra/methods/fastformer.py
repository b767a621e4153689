"""`fastformer-fit`, `fastformer-fit-causal`: Fastformer's additive attention (Wu et al. 2021, "Fastformer:
Additive Attention Can Be All You Need"), its vectors fitted per head to the frozen model's head output.

Per head, on the layer's own q, k, v (n × d):

    α_i = softmax_i(w_qᵀ q_i / √d),  q_g = Σ_i α_i q_i             (the global query)
    p_i = q_g ⊙ k_i,  β_i = softmax_i(w_kᵀ p_i / √d),  k_g = Σ_i β_i p_i   (the global key)
    u_i = k_g ⊙ v_i,  o_i = W_r u_i + b_r                            (the output transform)

Fastformer trains w_q, w_k with the model, so it is not a training-free stand-in for a pretrained head; fitted,
it is: each head's w_q, w_k, W_r, b_r minimize ‖PV − O‖²_F/‖PV‖²_F on the calibration sequences, as
`linformer-fit` fits E and F (`nn.descent`: full-batch Adam, the best step on held-out sequences kept). The
start is w_q = w_k = 0 — uniform pooling, q_g and k_g the means — with W_r, b_r the exact minimiser of that
objective at that start (a weighted least squares of PV on [u, 1]): the fit begins at the best output transform
of mean pooling and can only improve on it. The paper's layer also adds the query to the output
(o_i = W_r u_i + q_i); a pretrained head's output P V has no such term, so it is left out (docs/methods.md
measures both).

`fastformer-fit-causal` is the form for decoders: every quantity at position i uses positions ≤ i only —
q_g(i) and k_g(i) are softmax-weighted sums over the prefix, p_j = q_g(j) ⊙ k_j with the prefix global query at
j — computed in O(n d) by prefix sums with a running maximum (`prefix_pooled`). It is fitted on the decoder's
causal attention (P V with the causal mask); on a bidirectional layer it is `fastformer-fit`.

Padded positions take part in neither softmax. The cost is O(n d) per head plus the d × d output transform per
token: there is no budget, so one fit serves every k of a sweep and the tables show the same numbers at every k
(a flat line in the figures); the fit history's rows have budget −1. The method has no n × n P̃ (its output is
not a mixing of the value rows), so only the output error is measured.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..kernels import masked_softmax
from ..nn.calibration import CHUNK, Calibration
from ..reporter import Reporter
from ..nn.descent import FitSettings, descend, first_group_timer, validation_split
from .base import Approximation, Calibrated, Draws, Layer, register

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 120

#: positions per block of the causal form's prefix sums (the block length changes only the rounding)
CAUSAL_BLOCK = 64
#: the parameters of one head, in this order: w_q (d), w_k (d), W_r (d, d), b_r (d)
NAMES = ("w_q", "w_k", "w_r", "b_r")


def pooled(logits: torch.Tensor, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Σ_i softmax_i(logits) x_i over the kept positions: logits (B, H, n), x (B, H, n, d), keep (B, 1, n) →
    (B, H, 1, d); zero for a sequence keeping none."""
    weights = masked_softmax(logits, keep)
    return torch.einsum("bhn,bhnd->bhd", weights, x)[:, :, None]


def running_scale(logits: torch.Tensor) -> torch.Tensor:
    """c_i (B, H, n): the largest logit at or before i (−inf ones are not kept), the float-safety factor of row i's
    prefix sums; before the first kept position the first kept logit, 0 for a sequence keeping none. A constant
    of the computation (it cancels), so no gradient flows through it."""
    c = logits.detach().cummax(-1).values
    first = torch.where(torch.isfinite(c), c, float("inf")).amin(-1, keepdim=True)  # c is nondecreasing
    c = torch.maximum(c, first)
    return torch.where(torch.isfinite(c), c, 0.0)


def prefix_pooled(logits: torch.Tensor, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Row i = Σ_{j≤i} softmax_{j≤i}(logits)_j x_j over the kept positions: logits (B, H, n), x (B, H, n, d), keep
    (B, 1, n) → (B, H, n, d); zero where no position at or before i is kept.

    Row i's sums are carried as Σ_{j≤i} e^{a_j − c_i} x_j with c_i the running maximum (`running_scale`), so every
    exponent is ≤ 0: blocks of `CAUSAL_BLOCK` positions, the sums of earlier blocks carried as a state (rescaled
    as c grows), the positions of the row's own block summed directly. O(n · block · d)."""
    a = logits.masked_fill(~keep, float("-inf"))
    c = running_scale(a)
    n = a.shape[-1]
    state = x.new_zeros(x.shape[:-2] + x.shape[-1:])  # Σ_{j<first} e^{a_j − c_last} x_j
    norm = a.new_zeros(a.shape[:-1])  # Σ_{j<first} e^{a_j − c_last}
    last = c[..., :1]
    rows = []
    for first in range(0, n, CAUSAL_BLOCK):
        block = slice(first, min(first + CAUSAL_BLOCK, n))
        i = torch.arange(block.start, block.stop, device=a.device)
        later = i[None, :] > i[:, None]  # (L, L): j after i
        weights = (a[..., None, block] - c[..., block, None]).masked_fill(later, float("-inf")).exp()  # (B, H, L, L)
        decay = torch.exp(last - c[..., block])  # (B, H, L), ≤ 1
        numerator = decay[..., None] * state[..., None, :] + weights @ x[..., block, :]
        denominator = decay * norm[..., None] + weights.sum(-1)
        rows.append(torch.where(denominator[..., None] > 0,
                                numerator / denominator[..., None].clamp_min(torch.finfo(x.dtype).tiny), 0.0))
        end = c[..., block.stop - 1:block.stop]
        carried = torch.exp(a[..., block] - end)  # (B, H, L)
        state = state * torch.exp(last - end) + torch.einsum("bhj,bhjd->bhd", carried, x[..., block, :])
        norm = norm * torch.exp(last - end)[..., 0] + carried.sum(-1)
        last = end
    return torch.cat(rows, dim=-2)


def additive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, causal: bool,
                       w_q: torch.Tensor, w_k: torch.Tensor, w_r: torch.Tensor, b_r: torch.Tensor) -> torch.Tensor:
    """Fastformer's output O (B, H, n, d) from q, k, v (B, H, n, d), valid (B, n), and per head w_q, w_k (H, d),
    W_r (H, d, d), b_r (H, d) (see the module docstring); `causal`: every position uses positions ≤ it only.
    v must be zero on padded rows (then a padded query's output is b_r)."""
    scale = q.shape[-1] ** -0.5
    keep = valid[:, None, :]
    pool = prefix_pooled if causal else pooled
    q_g = pool(torch.einsum("bhnd,hd->bhn", q, w_q) * scale, q, keep)  # (B, H, n|1, d)
    p = q_g * k
    k_g = pool(torch.einsum("bhnd,hd->bhn", p, w_k) * scale, p, keep)
    return torch.einsum("bhnd,hed->bhne", k_g * v, w_r) + b_r[:, None, :]


def output_transform(calib: Calibration, rows: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """W_r (H, d, d), b_r (H, d) minimizing Σ_s ‖PV − W_r u − b_r‖²/‖PV‖² over the valid rows of the sequences
    `rows` at w_q = w_k = 0 (uniform pooling): a least squares of PV on [u, 1], each sequence's rows weighted by
    1/‖PV‖², in float64 (the minimum-norm solution if [u, 1] is rank deficient)."""
    heads, d = calib.heads, calib.q.shape[-1]
    zero = calib.q.new_zeros(heads, d)
    design, target = [], []
    for first in range(0, len(rows), CHUNK):
        part = calib.subset(rows[first:first + CHUNK])
        v = part.v.masked_fill(~part.valid[:, None, :, None], 0.0)
        u = additive_attention(part.q, part.k, v, part.valid, causal, zero, zero,
                               torch.eye(d, dtype=v.dtype).expand(heads, d, d), zero)
        weight = part.target.square().sum((-2, -1)).clamp_min(torch.finfo(v.dtype).tiny).rsqrt()  # (s, H)
        rows_kept = part.valid[:, None, :, None].double() * weight[..., None, None].double()
        ones = torch.ones_like(u[..., :1])
        design.append((torch.cat([u, ones], -1).double() * rows_kept).transpose(0, 1).flatten(1, 2))
        target.append((part.target.double() * rows_kept).transpose(0, 1).flatten(1, 2))
    solution = torch.linalg.lstsq(torch.cat(design, 1), torch.cat(target, 1), driver="gelsd").solution  # (H, d+1, d)
    return solution[:, :d].transpose(-1, -2).to(calib.q.dtype), solution[:, d].to(calib.q.dtype)


@register
class Fastformer(Calibrated):
    """Fastformer's additive attention with w_q, w_k, W_r, b_r fitted per (layer, head) on the calibration
    sequences; `causal`: the prefix form on a decoder's layer."""

    variants = {"fastformer-fit": {"causal": False, "color": "#e7298a", "marker": "$F$", "short": "fastf\nfit"},
                "fastformer-fit-causal": {"causal": True, "color": "#8a2be2", "marker": "$f$",
                                          "short": "fastf\ncausal"}}

    def __init__(self, label: str, *, causal: bool, **shown: str) -> None:
        super().__init__(label, **shown)
        self.causal = causal
        self.parameters: dict[int, tuple[torch.Tensor, ...]] = {}

    def reset(self) -> None:
        self.parameters = {}

    @property
    def fitted(self) -> bool:
        return bool(self.parameters)

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        if x.layer not in self.parameters:
            raise self.unfitted()
        weights = (p.to(x.q) for p in self.parameters[x.layer])
        return Approximation(additive_attention(x.q, x.k, x.v, x.valid, self.causal and x.causal, *weights), None)

    def fit(self, calibrations: Sequence[Calibration], *, layers: int, heads: int, n: int, settings: FitSettings,
            reporter: Reporter) -> pd.DataFrame:
        """Each layer's heads fitted together (each head its own unit and kept step), layer after layer."""
        rows: list[dict] = []
        progress = first_group_timer(reporter, self.label, len(calibrations), settings.steps)
        kept_steps = []
        for calib in calibrations:
            causal = self.causal and calib.causal
            train, held = validation_split(calib.sequences, settings.validation, settings.seed)
            w_r, b_r = output_transform(calib, train, causal)
            d = calib.q.shape[-1]
            units = [[calib.q.new_zeros(d).requires_grad_(), calib.q.new_zeros(d).requires_grad_(),
                      w_r[h].clone().requires_grad_(), b_r[h].clone().requires_grad_()] for h in range(calib.heads)]

            def errors(index: torch.Tensor, backward: bool, calib: Calibration = calib, causal: bool = causal,
                       units: list = units) -> list[float]:
                return head_errors(calib, index, causal, units, backward)

            def record(step: int, calibration: Sequence[float], check: Sequence[float],
                       layer: int = calib.layer) -> None:
                for head, (train_error, held_error) in enumerate(zip(calibration, check)):
                    row = {"budget": -1, "layer": layer, "head": head, "step": step, "calibration": train_error,
                           "validation": held_error}
                    rows.append(row)
                progress(rows[-1])

            kept_steps += descend(units, lambda backward: errors(train, backward),
                                  (lambda: errors(held, False)) if settings.validation > 0 else None,
                                  steps=settings.steps, lr=settings.lr, record=record)
            self.parameters[calib.layer] = tuple(torch.stack([unit[i].detach() for unit in units])
                                                 for i in range(len(NAMES)))
        reporter.notify(f"fitted {self.label}: kept steps {min(kept_steps)}–{max(kept_steps)} of {settings.steps} "
               f"(per head)")
        return pd.DataFrame(rows, columns=["budget", "layer", "head", "step", "calibration", "validation"])

    def arrays(self) -> dict[str, np.ndarray]:
        if not self.parameters:
            return {}
        layers = sorted(self.parameters)
        found = {f"{self.label}|layers": np.array(layers)}
        for i, name in enumerate(NAMES):
            found[f"{self.label}|{name}"] = torch.stack([self.parameters[layer][i] for layer in layers]).cpu().numpy()
        return found

    def load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        if f"{self.label}|layers" not in arrays:
            return
        stacked = [torch.from_numpy(np.asarray(arrays[f"{self.label}|{name}"]).copy()) for name in NAMES]
        self.parameters = {int(layer): tuple(part[i] for part in stacked)
                           for i, layer in enumerate(arrays[f"{self.label}|layers"])}


def head_errors(calib: Calibration, index: torch.Tensor, causal: bool, units: list[list[torch.Tensor]],
                backward: bool) -> list[float]:
    """Each head's mean ‖PV − O‖²_F/‖PV‖²_F over the valid rows of the sequences `index`, with the heads'
    parameters `units`; with `backward` the gradients of their sum are accumulated, a chunk at a time."""
    total = torch.zeros(calib.heads, dtype=torch.float64)
    for first in range(0, len(index), CHUNK):
        part = calib.subset(index[first:first + CHUNK])
        with torch.set_grad_enabled(backward):
            weights = [torch.stack([unit[i] for unit in units]) for i in range(len(NAMES))]
            v = part.v.masked_fill(~part.valid[:, None, :, None], 0.0)
            out = additive_attention(part.q, part.k, v, part.valid, causal, *weights)
            target = part.target
            error = (out - target).masked_fill(~part.valid[:, None, :, None], 0.0).square().sum((-2, -1))
            error = (error / target.square().sum((-2, -1)).clamp_min(torch.finfo(target.dtype).tiny)).sum(0)
            error = error / len(index)  # (H,)
            if backward:
                error.sum().backward()
        total += error.detach().double()
    return total.tolist()
