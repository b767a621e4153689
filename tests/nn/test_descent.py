"""The fitting loop every fitted method shares: the kept step against a direct search of the recorded errors,
independent units, determinism, the split, and the settings of a run."""

from __future__ import annotations

import math

import pytest
import torch

from spectra.reporter import Reporter
from spectra.config import FitInit
from spectra.kinds.approx import ApproxOptions
from spectra.errors import SpectraError
from spectra.nn.descent import FitSettings, descend, first_group_timer, rms, validation_split

pytestmark = pytest.mark.usefixtures("one_thread")


def problem(seed: int = 0):
    """Two independent least-squares units, each with its own noisy data and held-out data that disagree a little,
    so descent first helps the held-out error, then overfits."""
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64),
             torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64))
            for _ in range(2)]
    units = [[torch.full((3,), 0.5, dtype=torch.float64, requires_grad=True)] for _ in range(2)]

    def train(backward: bool) -> list[float]:
        errors = [((a @ unit[0] - b) ** 2).mean() for (a, b, _, _), unit in zip(data, units)]
        if backward:
            sum(errors).backward()
        return [e.item() for e in errors]

    def held() -> list[float]:
        with torch.no_grad():
            return [((c @ unit[0] - d) ** 2).mean().item() for (_, _, c, d), unit in zip(data, units)]

    return units, train, held


def test_each_unit_keeps_its_best_held_out_step_not_worse_than_the_start() -> None:
    units, train, held = problem()
    recorded: list[tuple[int, list[float], list[float]]] = []
    values: list[list[torch.Tensor]] = []

    def record(step, calibration, check):
        recorded.append((step, list(calibration), list(check)))
        values.append([unit[0].detach().clone() for unit in units])

    kept = descend(units, train, held, steps=30, lr=0.1, record=record)
    assert [step for step, _, _ in recorded] == list(range(31))
    for u in range(2):
        start = recorded[0][1][u]
        candidates = [(check[u], step) for step, calibration, check in recorded if calibration[u] <= start]
        best = min(candidates)[1]  # the lowest held-out error, the earliest on a tie
        assert kept[u] == best
        assert torch.equal(units[u][0].detach(), values[best][u]), "the parameters are those of the kept step"
    assert any(step > 0 for step in kept), "descent helped"


def test_units_are_independent_and_the_loop_is_deterministic() -> None:
    both, train, held = problem()
    kept = descend(both, train, held, steps=12, lr=0.1)
    again, train2, held2 = problem()
    assert descend(again, train2, held2, steps=12, lr=0.1) == kept
    assert all(torch.equal(a[0], b[0]) for a, b in zip(both, again)), "same inputs, same bits"


def test_without_a_held_out_share_the_calibration_error_chooses() -> None:
    units, train, _ = problem(1)
    recorded = []
    kept = descend(units, train, None, steps=10, lr=0.05, record=lambda t, c, h: recorded.append((c, h)))
    assert all(c == h for c, h in recorded)
    assert kept == [min(range(11), key=lambda t: (recorded[t][0][u], t)) for u in range(2)]


def test_rms_is_the_unit_of_a_step() -> None:
    assert rms(torch.tensor([3.0, -4.0])) == pytest.approx(math.sqrt(12.5)) and rms(torch.zeros(4)) == 1.0


def test_validation_split_is_seeded_and_disjoint() -> None:
    train, held = validation_split(10, 0.25, seed=3)
    assert len(held) == 2 and sorted(train.tolist() + held.tolist()) == list(range(10))
    assert torch.equal(held, validation_split(10, 0.25, seed=3)[1])
    assert validation_split(4, 0.0, 0)[1].numel() == 0
    with pytest.raises(SpectraError, match="needs ≥ 2 calibration sequences"):
        validation_split(1, 0.25, 0)
    with pytest.raises(SpectraError, match="steps must be ≥ 0 and lr > 0"):
        descend([], lambda backward: [], None, steps=3, lr=0)


def test_settings_of_a_run_and_the_first_group_timer() -> None:
    options = ApproxOptions(budget=(4, 8), methods=("linformer-fit(kv)",), fit_samples=8, fit_steps=5, fit_lr=0.2, fit_init="pca",
                            k_plan=(4, 12))
    assert FitSettings.of(options, seed=3) == FitSettings((4, 8, 12), 5, 0.2, FitInit.PCA, 0.25, 3)
    lines: list[str] = []
    progress = first_group_timer(Reporter(None, lines.append), "linformer-fit(kv) at k = 4", groups=3, steps=2)
    for step in (0, 1, 2, 0, 1, 2):
        progress({"step": step})
    assert len(lines) == 1 and lines[0].startswith("fitting linformer-fit(kv) at k = 4: the first of 3 layers took")
    alone = first_group_timer(Reporter(None, lines.append), "x", groups=1, steps=2)
    alone({"step": 2})
    assert len(lines) == 1, "one group: nothing to forecast"
