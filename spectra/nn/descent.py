"""The fitting loop every fitted method shares: full-batch Adam, keeping the best step on held-out sequences.

A fitted method (`linformer-fit`, `fastformer-fit`) minimizes its calibration error over some parameters of
the frozen model's attention. Fixed parameters overfit a small calibration set, so a seeded share of the
calibration sequences is held out (`validation_split`), and of the steps 0 … `steps` (step 0 is the
initialisation) each fitted unit keeps the one with the lowest held-out error among those whose calibration
error is not above step 0's: never worse than the start on either set. `descend` runs that loop for several
independent units at once (a unit: a layer of Linformer projections, a head of Fastformer's vectors), each
with its own kept step. On CPU it is bitwise reproducible for a fixed number of torch threads: gradients are
full-batch, sums have a fixed order and the only random draw is the seeded split.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..config import FitInit
from ..errors import SpectraError
from ..reporter import Reporter
from ..seeds import Domain, derive_seed


@dataclass(frozen=True)
class FitSettings:
    """How a fitted method fits: at every k in `budgets` (a method whose parameters have no budget fits once),
    `steps` full-batch Adam steps at `lr` — relative to each parameter's root-mean-square entry at the start —
    from `init` (for a method that offers a choice of start), a seeded `validation` share of the calibration
    sequences held out to choose the step."""

    budgets: tuple[int, ...] = ()
    steps: int = 200
    lr: float = 0.1
    init: FitInit = FitInit.POOLING
    validation: float = 0.25
    seed: int = 0

    @classmethod
    def of(cls, options: Any, seed: int) -> "FitSettings":
        """The fit settings of a `spectra approx` run (its `kinds.approx.ApproxOptions`)."""
        return cls(options.fit_budgets, options.fit_steps, options.fit_lr, options.fit_init, options.fit_validation,
                   seed)


def held_out(sequences: int, share: float) -> int:
    """How many of `sequences` calibration sequences a validation `share` holds out: at least one, and one fewer
    than all, when share > 0 (and there are two); none when share = 0."""
    return 0 if share == 0 or sequences < 2 else min(max(round(share * sequences), 1), sequences - 1)


def validation_split(sequences: int, share: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibration, validation) sequence indices, sorted: a seeded share held out (at least one sequence
    each side when share > 0; none held out when share = 0)."""
    if not 0 <= share < 1:
        raise SpectraError(f"validation must be a share in [0, 1), got {share}")
    if share == 0:
        return torch.arange(sequences), torch.arange(0)
    if sequences < 2:
        raise SpectraError(f"holding out a validation share needs ≥ 2 calibration sequences, got {sequences}")
    held = held_out(sequences, share)
    order = torch.from_numpy(np.random.default_rng(derive_seed(seed, Domain.LINFORMER_FIT, sequences)).permutation(sequences))
    return order[held:].sort().values, order[:held].sort().values


def rms(matrix: torch.Tensor) -> float:
    """The root-mean-square entry of a parameter (1 for a zero one): the unit of its Adam steps."""
    value = matrix.detach().double().square().mean().sqrt().item()
    return value if value > 0 else 1.0


def descend(units: Sequence[Sequence[torch.Tensor]], train: Callable[[bool], Sequence[float]],
            held: Callable[[], Sequence[float]] | None, *, steps: int, lr: float,
            record: Callable[[int, Sequence[float], Sequence[float]], None] | None = None) -> list[int]:
    """Adam on the parameters of every unit for `steps` steps; returns each unit's kept step, its parameters set
    to their values at that step.

    `train(backward)` gives each unit's calibration error and, with `backward`, accumulates the gradients of their
    sum; `held()` each unit's held-out error (None: the calibration error stands for it). The units must be
    independent (no parameter's gradient depends on another unit's error). Each parameter's learning rate is `lr`
    times its root-mean-square entry at the start (one setting whatever the parameter's scale). At every step
    t = 0 … steps both errors are measured and passed to `record(t, calibration, held_out)`; a unit keeps the
    step with the lowest held-out error among those whose calibration error is not above step 0's."""
    if steps < 0 or not lr > 0:
        raise SpectraError(f"steps must be ≥ 0 and lr > 0, got steps = {steps}, lr = {lr}")
    parameters = [p for unit in units for p in unit]
    optimizer = torch.optim.Adam([{"params": [p], "lr": lr * rms(p)} for p in parameters])
    best, start = [math.inf] * len(units), [math.inf] * len(units)
    kept_step = [0] * len(units)
    kept = [[p.detach().clone() for p in unit] for unit in units]
    for step in range(steps + 1):
        optimizer.zero_grad(set_to_none=True)
        calibration = list(train(step < steps))
        check = list(held()) if held is not None else calibration
        if record is not None:
            record(step, calibration, check)
        for u, unit in enumerate(units):
            start[u] = calibration[u] if step == 0 else start[u]
            if check[u] < best[u] and calibration[u] <= start[u]:
                best[u], kept_step[u] = check[u], step
                kept[u] = [p.detach().clone() for p in unit]
        if step < steps:
            optimizer.step()
    with torch.no_grad():
        for unit, values in zip(units, kept):
            for parameter, value in zip(unit, values):
                parameter.copy_(value)
    return kept_step


def first_group_timer(reporter: Reporter, what: str, groups: int,
                      steps: int) -> Callable[[dict], None]:
    """A fit's progress callback (it sees each history row): once its first of `groups` groups (layers) is
    fitted, one line with the time it took and what the rest will take, so a long fit is not silent."""
    started, said = time.perf_counter(), []

    def progress(row: dict) -> None:
        if row["step"] == steps and not said and groups > 1:
            took = time.perf_counter() - started
            said.append(took)
            reporter.notify(f"fitting {what}: the first of {groups} layers took {took:.0f} s; about "
                   f"{took * (groups - 1) / 60:.1f} min more")

    return progress
