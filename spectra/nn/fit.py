"""Data-driven and fitted Linformer projections for a frozen pretrained model: eq. 7 calibrated on its own q, k, v.

The Linformer learns E_i, F_i with the model. For a frozen pretrained model we look instead for the fixed
projections that bring eq. 7, softmax(Q (E K)ᵀ s)(F V), closest to the model's own attention output P V on a
calibration set of its captured q, k, v (`Calibration`, one per layer). The objective is `head_output_error`,
‖P V − softmax(Q (E K)ᵀ s)(F V)‖²_F / ‖P V‖²_F per (sequence, head) over valid rows (its square root is the
`out_err` of `spectra approx`). Three sets of projections:

- `pooling_projections`: E = F = M, mean pooling over k windows; with equal windows eq. 7 is then
  exactly the `pool-mean` method on full-length sequences. The fit's default start.
- `pca_projections` (closed form): the top eigenvectors of the keys' (values') n × n position second moment,
  signed to sum positive and scaled by the positive factors that minimize the calibration error.
- `fit_projections`: Adam on E, F minimizing the mean objective; the best step on held-out sequences is kept
  (`nn.descent`, the loop every fitted method shares).

A sequence of m < n tokens uses the first m columns (the paper's slicing rule); padded keys are zeroed before
projecting, so a right-padded sequence counts exactly as its m tokens alone. Memory: a layer's calibration
holds q, k, v and P V, 4·S·H·n·d numbers (16·S·H·n·d bytes in float32: 400 MB for 64 sequences of a BERT-base
layer, H = 12, n = 512, d = 64); the fit adds about 4·CHUNK·H·n·(budget + d) numbers of autograd activations.
Layers are fitted one at a time (jointly under `layerwise`, whose one E = F they share). On CPU results are
bitwise reproducible for a fixed number of torch threads: every sum has a fixed order, gradients are
full-batch, and the only random draw is the seeded validation split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd
import torch

from ..config import Sharing, choose
from ..errors import SpectraError
from ..kernels import eq7
from .calibration import CHUNK, Calibration, by_layer, head_output_error, pooling_projections
from .descent import descend, validation_split
from .projections import Key, Projections, projection_key

#: the log10 grid of the PCA scale search (α = 1, the raw eigenvectors, is one of its points), then golden
#: section in the grid cell around the best point
SCALE_GRID = tuple(t / 4 for t in range(-16, 5))
GOLDEN_STEPS = 16


def _second_moment(x: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
    """Σ_s X_s X_sᵀ (H, n, n) in float64 over the sequences of x (S, H, m ≤ n, d); padded rows count as zero."""
    m = x.shape[-2]
    moment = torch.zeros(x.shape[1], n, n, dtype=torch.float64)
    for start in range(0, x.shape[0], CHUNK):
        part = x[start:start + CHUNK].double().masked_fill(~valid[start:start + CHUNK, None, :, None], 0.0)
        moment[:, :m, :m] += torch.einsum("shid,shjd->hij", part, part)
    return moment


def principal_rows(moment: torch.Tensor, budget: int) -> torch.Tensor:
    """The top-`budget` unit eigenvectors (budget, n) of a symmetric n × n matrix, largest eigenvalue first,
    each signed so that its entries sum positive (its largest entry positive when they sum to 0)."""
    _, vectors = torch.linalg.eigh(moment)
    rows = vectors[:, -budget:].flip(-1).T
    total = rows.sum(-1)
    largest = rows.gather(-1, rows.abs().argmax(-1, keepdim=True))[:, 0]
    sign = torch.where(total.abs() > 1e-9 * rows.abs().sum(-1), total.sign(), largest.sign())
    return rows * sign[:, None]


def _scale_search(calibs: dict[int, Calibration], projections: Projections, groups: list[Key]) -> None:
    """Multiply each (E, F) pair of `projections` (named by E's key) in place by the positive scales
    minimizing the mean calibration error of its heads: E = F → one α (1-D search); E, F distinct → α for E
    searched, the best β for F in closed form (the output is linear in β: β* = ⟨T, A⟩ / ‖A‖², means over the
    group's heads)."""
    sharing, index = projections.sharing, {group: i for i, group in enumerate(groups)}
    tied = sharing in (Sharing.KV, Sharing.LAYERWISE)

    @torch.no_grad()
    def evaluate(log_alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(error, β) per group at E scaled by 10^log_alpha (and F by it when tied, else by the best β)."""
        cross, power, count = (torch.zeros(len(groups), dtype=torch.float64) for _ in range(3))
        for layer, calib in calibs.items():
            g = torch.tensor([index[projection_key(sharing, layer, h, "e")] for h in range(calib.heads)])
            e, f = projections.pair(layer, calib.n)
            alpha = (10 ** log_alpha[g]).to(e)[:, None, None]
            e, f = e * alpha, (f * alpha if tied else f)
            for start in range(0, calib.sequences, CHUNK):
                part = calib.subset(slice(start, start + CHUNK))
                out, _ = eq7(part.q, part.k, part.v, e, f, part.valid, part.scaling)
                out = out.masked_fill(~part.valid[:, None, :, None], 0.0)
                norm = part.target.square().sum((-2, -1)).clamp_min(torch.finfo(out.dtype).tiny)
                cross.index_add_(0, g, ((out * part.target).sum((-2, -1)) / norm).double().sum(0))
                power.index_add_(0, g, (out.square().sum((-2, -1)) / norm).double().sum(0))
                count.index_add_(0, g, torch.full((calib.heads,), float(part.sequences), dtype=torch.float64))
        cross, power = cross / count, power / count
        beta = torch.ones_like(cross) if tied else (cross / power.clamp_min(1e-300)).clamp_min(0.0)
        return 1 - 2 * beta * cross + beta.square() * power, beta

    grid = torch.tensor(SCALE_GRID, dtype=torch.float64)
    results = [evaluate(torch.full((len(groups),), t, dtype=torch.float64)) for t in grid]
    errors = torch.stack([error for error, _ in results])  # (grid, groups)
    best = errors.argmin(0)
    best_t, best_error = grid[best], errors.min(0).values
    best_beta = torch.stack([beta for _, beta in results])[best, range(len(groups))]
    low, high, ratio = best_t - 0.25, best_t + 0.25, (math.sqrt(5) - 1) / 2
    for _ in range(GOLDEN_STEPS):  # golden section per group in lockstep; only improvements are kept
        left, right = high - ratio * (high - low), low + ratio * (high - low)
        (e_left, b_left), (e_right, b_right) = evaluate(left), evaluate(right)
        for t, error, beta in ((left, e_left, b_left), (right, e_right, b_right)):
            better = error < best_error
            best_t, best_error, best_beta = (torch.where(better, t, best_t), torch.where(better, error, best_error),
                                             torch.where(better, beta, best_beta))
        closer = e_left < e_right
        high, low = torch.where(closer, right, high), torch.where(closer, low, left)
    for group, i in index.items():
        alpha, beta = 10 ** best_t[i], best_beta[i]
        for key, factor in ({group: alpha} if tied else {(*group[:2], "e"): alpha, (*group[:2], "f"): beta}).items():
            _stored(projections, key).mul_(float(factor))


def _stored(projections: Projections, key: Key) -> torch.Tensor:
    """The stored parameter of a distinct key."""
    layer, head, which = key
    return projections.matrix(max(layer, 0), max(head, 0), "e" if which == "ef" else which)


def pca_projections(calibs: Sequence[Calibration], layers: int, heads: int, budget: int, n: int,
                    sharing: Sharing | str, *, scale: bool = True) -> Projections:
    """Data-driven E, F (closed form): the top-`budget` eigenvectors (rows) of the n × n position second moment.

    E of a layer from Σ_{sequences, heads} K Kᵀ, F from Σ V Vᵀ (per head under `none`); `kv`: one matrix from
    C_K/tr C_K + C_V/tr C_V (keys and values weighed equally, whatever their norms); `layerwise`: one E = F from
    that sum over the calibrated layers. A sequence shorter than n adds its valid block (zero rows elsewhere).
    Each row is signed to sum positive (the top one is then ≈ a positive average, like pooling).

    Why `scale`: softmax over projected keys is not linear, so the length of the rows matters. A unit
    eigenvector close to 1/√n·𝟙 projects to √n times the mean key, sharpening the softmax by √n; raw unit rows
    are worse than random ones on a real model. So each pair is scaled by the positive factors minimizing its
    mean calibration `head_output_error` (E = F: one α; E ≠ F: α for E by a log grid over 10⁻⁴…10 then golden
    section, and the best β for F in closed form; α at the grid's bottom is in effect E = 0, uniform weights over
    F V). α = β = 1 is a candidate, so scaling never does worse than the raw eigenvectors; `scale=False`
    keeps them. Layers without a calibration get the pooling matrix.
    """
    sharing = choose(Sharing, sharing, "sharing")
    found = by_layer(calibs, layers, heads, budget, n)
    projections = pooling_projections(layers, heads, budget, n, sharing, next(iter(found.values())).q.dtype)
    projections.requires_grad_(False)
    moments: dict[Key, torch.Tensor] = {}

    def add(key: Key, moment: torch.Tensor) -> None:
        moments[key] = moments[key] + moment if key in moments else moment

    for layer, calib in found.items():
        k_moment, v_moment = (_second_moment(x, calib.valid, n) for x in (calib.k, calib.v))
        if sharing == Sharing.NONE:
            for head in range(heads):
                add((layer, head, "e"), k_moment[head])
                add((layer, head, "f"), v_moment[head])
        elif sharing == Sharing.HEADWISE:
            add((layer, -1, "e"), k_moment.sum(0))
            add((layer, -1, "f"), v_moment.sum(0))
        else:
            k_sum, v_sum = k_moment.sum(0), v_moment.sum(0)
            both = k_sum / k_sum.trace().clamp_min(1e-300) + v_sum / v_sum.trace().clamp_min(1e-300)
            add(projection_key(sharing, layer, 0, "e"), both)
    for key, moment in moments.items():
        _stored(projections, key).copy_(principal_rows(moment, budget))
    if scale:
        groups = list(dict.fromkeys(projection_key(sharing, layer, head, "e") for layer in found
                                    for head in range(heads)))
        _scale_search(found, projections, groups)
    return projections


@dataclass
class Fit:
    """The fitted projections (frozen), the history (one row per fitted group and step: `layer` — −1 for the
    joint layerwise fit — `step`, `calibration` and `validation`, the mean `head_output_error` of each set at
    that step's projections) and the kept step of each group (0 is the initialisation)."""

    projections: Projections
    history: pd.DataFrame
    best_step: dict[int, int]


def _mean_error(calibs: dict[int, Calibration], index: dict[int, torch.Tensor], projections: Projections,
                backward: bool) -> float:
    """Mean over layers of the mean head_output_error over the indexed sequences and heads; with `backward`
    its gradient is accumulated into the projections, a chunk of sequences at a time."""
    total = 0.0
    for layer, calib in calibs.items():
        rows = index[layer]
        for start in range(0, len(rows), CHUNK):
            part = calib.subset(rows[start:start + CHUNK])
            with torch.set_grad_enabled(backward):
                e, f = projections.pair(layer, calib.n)
                error = head_output_error(part, e, f).sum() / (len(rows) * calib.heads * len(calibs))
                if backward:
                    error.backward()
            total += error.item()
    return total


def fit_projections(calibs: Sequence[Calibration], layers: int, heads: int, budget: int, n: int,
                    sharing: Sharing | str, *, init: Projections | None = None, steps: int = 200,
                    lr: float = 0.1, seed: int = 0, validation: float = 0.25,
                    progress: Callable[[dict], None] | None = None) -> Fit:
    """E, F minimizing the mean `head_output_error` over calibration sequences and heads, the model frozen.

    Full-batch Adam for `steps` steps, `lr` relative to each matrix's root-mean-square entry at init (one
    setting for any n and budget; pooling entries are k/n), from `init`: by default
    `pooling_projections` (the fit starts at pool-mean), or given projections (e.g. `pca_projections`; their
    Theorem 2 scales δ are kept). A seeded `validation` share of the
    sequences is held out; at every step t = 0 … steps both errors are recorded, and the kept step is the
    one with the lowest validation error among the steps whose calibration error is not above step 0's
    (the initialisation is a candidate): never worse than the init on either set (fixed projections
    overfit a small calibration set). Groups are fitted one after the other: each layer under none,
    headwise and kv (independent), all layers jointly under layerwise. `progress(row)` sees each row.
    Layers without a calibration keep the init.
    """
    sharing = choose(Sharing, sharing, "sharing")
    found = by_layer(calibs, layers, heads, budget, n)
    if steps < 0 or not lr > 0:
        raise SpectraError(f"steps must be ≥ 0 and lr > 0, got steps = {steps}, lr = {lr}")
    dtype = next(iter(found.values())).q.dtype
    init = init if init is not None else pooling_projections(layers, heads, budget, n, sharing, dtype)
    shape = (init.layers, init.heads, init.budget, init.max_len, init.sharing)
    if shape != (layers, heads, budget, n, sharing):
        raise SpectraError(f"init projections (layers, heads, budget, n, sharing) = {shape} do not fit "
                           f"{(layers, heads, budget, n, sharing)}")
    weights = {key: _stored(init, key).detach().to(dtype) for key in init.keys}
    projections = Projections(layers, heads, budget, n, sharing, weights=weights)
    projections.e_scale, projections.f_scale = init.e_scale, init.f_scale
    splits = {layer: validation_split(calib.sequences, validation, seed) for layer, calib in found.items()}
    groups = [[-1]] if sharing == Sharing.LAYERWISE else [[layer] for layer in found]
    rows, best_step = [], {}
    for group in groups:
        members = {layer: found[layer] for layer in (found if group == [-1] else group)}
        parameters = [_stored(projections, key) for key in projections.keys if key[0] in (-1, *members)]
        train_rows = {layer: splits[layer][0] for layer in members}
        held_rows = {layer: splits[layer][1] for layer in members}

        def record(step: int, train: Sequence[float], check: Sequence[float], group: list[int] = group) -> None:
            row = {"layer": group[0], "step": step, "calibration": train[0], "validation": check[0]}
            rows.append(row)
            if progress is not None:
                progress(row)

        kept = descend([parameters], lambda backward: [_mean_error(members, train_rows, projections, backward)],
                       (lambda: [_mean_error(members, held_rows, projections, backward=False)]) if validation > 0
                       else None, steps=steps, lr=lr, record=record)
        best_step[group[0]] = kept[0]
    history = pd.DataFrame(rows, columns=["layer", "step", "calibration", "validation"])
    return Fit(projections.requires_grad_(False), history, best_step)
