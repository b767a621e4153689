"""`spectra approx`'s per-head probe: every method at every budget on each layer's own q, k, v, and its errors.

Measures, per (method, budget, layer, head) over sequences: `out_err` = ‖P V − Ṽ‖_F/‖P V‖_F (what the
model uses), `p_err` = ‖P − P̃‖_F/‖P‖_F and `tv`, the mean row-wise total-variation distance between P
and P̃ (where the method has a P̃). Result: `heads.csv`, one row per (method, budget, layer, head, metric)
with samples, mean, median, p95, max and the fraction at most the target.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import torch

from ..capture import Captured
from ..methods import Approximation, Draws, Layer, Method, resolve
from ..spectrum import masked
from ..stats import ErrorStats, State
from .base import Probe

MEASURES = ("out_err", "p_err", "tv")


def measures(x: Layer, approx: Approximation) -> torch.Tensor:
    """MEASURES (3, B, H) of one approximation; NaN where the method has no P̃.

    out_err = ‖P V − Ṽ‖_F/‖P V‖_F over valid rows; p_err = ‖P − P̃‖_F/‖P‖_F; tv = mean over valid rows
    of the total-variation distance between P's row and P̃'s row made a distribution (negative
    entries clipped to 0, then renormalised; a row with no positive mass counts as distance 1).
    """
    rows = x.valid[:, None, :, None].to(x.v.dtype)
    exact = (x.p @ x.v) * rows
    tiny = torch.finfo(exact.dtype).tiny
    out_err = ((approx.out * rows - exact).flatten(-2).norm(dim=-1)
               / exact.flatten(-2).norm(dim=-1).clamp_min(tiny))
    if approx.p is None:
        nan = torch.full_like(out_err, math.nan)
        return torch.stack([out_err, nan, nan])
    p, p_tilde = x.p, masked(approx.p, x.valid)
    p_err = (p - p_tilde).flatten(-2).norm(dim=-1) / p.flatten(-2).norm(dim=-1).clamp_min(tiny)
    positive = p_tilde.clamp_min(0)
    mass = positive.sum(-1, keepdim=True)
    row_tv = torch.where(mass[..., 0] > 0, 0.5 * (p - positive / mass.clamp_min(tiny)).abs().sum(-1), 1.0)
    valid_rows = x.valid[:, None, :].to(row_tv.dtype)
    tv = (row_tv * valid_rows).sum(-1) / valid_rows.sum(-1).clamp_min(1)
    return torch.stack([out_err, p_err, tv])


class ApproxProbe(Probe):
    """Streams every layer through each (method, budget) and keeps error statistics.

    Cells are (method, budget, layer, head, measure); samples are sequences. Random methods draw per sequence
    unless the options fix the projection, so a mean comes with a 95% interval over sequences. The options'
    first `fit_samples` sequences (the calibration set) are left out, unless this probe measures that set itself
    (`calibration`, fed by the fitting probe); `fitted` holds the run's fitted instances of the
    methods that calibrate on them, by label; `budget_of` (a k plan) gives a layer its own budget in place of the
    sweep's.
    """

    def __init__(self, options: Any, layers: int, heads: int, *, seed: int = 0,
                 fitted: Mapping[str, Method] | None = None, budget_of: Callable[[int], int] | None = None,
                 file: str = "heads.csv", calibration: bool = False) -> None:
        self.options, self.seed, self.budget_of = options, seed, budget_of
        self.skip = 0 if calibration else options.fit_samples
        self.file = file
        self.labels, self.budgets = list(options.methods), list(options.budget)
        self.methods = [resolve(label, fitted) for label in self.labels]
        for method in self.methods:
            if method.calibrates and method.label not in (fitted or {}):
                raise method.unfitted()
        self.stats = ErrorStats((len(self.labels), len(self.budgets), layers, heads, len(MEASURES)),
                                eps=(options.target,))

    def update(self, captured: Captured) -> None:
        if min(captured.sequence_index()) < self.skip:
            return
        self.measure(Layer.of(captured), self.draws(captured))

    def draws(self, captured: Captured) -> Draws:
        """The draws of a captured batch under the run's seed and projection settings."""
        return Draws.of(captured, seed=self.seed, projection=self.options.projection,
                        fixed=self.options.fixed_projection)

    def measure(self, x: Layer, draws: Draws) -> None:
        """Every method at every budget on one layer's batch."""
        for i, method in enumerate(self.methods):
            for j, budget in enumerate(self.budgets):
                layer_budget = self.budget_of(x.layer) if self.budget_of is not None else budget
                errors = measures(x, method(x, layer_budget, draws)).permute(2, 0, 1)  # (H, measure, B)
                self.stats.add((i, j, x.layer), errors, keep=~errors.isnan())

    def state(self) -> State:
        return self.stats.state("heads")

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.stats.load_state(arrays, "heads")

    def tables(self) -> dict[str, pd.DataFrame]:
        """heads.csv: one row per (method, budget, layer, head, metric) with samples, mean, median, p95, max,
        target and pr_below_target, the fraction of sequences whose error is at most the target."""
        _, _, layers, heads, _ = self.stats.cells
        frame = self.stats.frame({"method": self.labels, "budget": self.budgets, "layer": list(range(layers)),
                                  "head": list(range(heads)), "metric": list(MEASURES)}, mean_interval=True)
        frame = frame[frame["samples"] > 0].rename(columns={"eps": "target", "pr": "pr_below_target"})
        if self.budget_of is not None:  # a k plan: each layer's own budget
            frame["budget"] = frame["layer"].map(self.budget_of).astype(int)
        return {self.file: frame.reset_index(drop=True)}
