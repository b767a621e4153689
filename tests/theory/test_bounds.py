"""Theorems 1 and 2's bounds and δ against hand-computed values (natural logs), and their bad input."""

from __future__ import annotations

import math

import pytest

from spectra.errors import SpectraError
from spectra.theory.bounds import (
    DELTA_RULES,
    check_deltas,
    delta_value,
    jl_failure_bound,
    theorem1_bound,
    theorem1_k,
    theorem2_k,
)


def test_bounds_against_hand_computed_values() -> None:
    # natural log: 5 ln 512 / (0.25 − 0.125) = 40 · 6.238325 = 249.533
    assert theorem1_k(0.5, 512) == pytest.approx(249.5330, abs=1e-3)
    assert theorem1_k(0.1, 512) == pytest.approx(5 * 6.2383246 / 0.009, rel=1e-6)
    assert jl_failure_bound(0.5, 64) == pytest.approx(2 * math.exp(-2.0))  # 0.125 · 64 / 4 = 2
    assert jl_failure_bound(0.5, 64) == pytest.approx(0.2706706, rel=1e-6)
    assert theorem1_bound(0.5, 512, 256) == pytest.approx(1 - 1024 * math.exp(-8.0))  # 0.6565
    assert theorem1_bound(0.5, 512, 256) == pytest.approx(0.6564863, rel=1e-6)
    assert theorem1_bound(0.5, 512, 64) == 0.0  # 1 − 1024 · 0.135 < 0
    # min{9 · 64 · ln 64, 5 ln 512} / 0.25 = min{2395.5, 31.19} / 0.25
    assert theorem2_k(0.5, 512, 64) == pytest.approx(124.7665, abs=1e-3)
    assert theorem2_k(0.5, 10**9, 2) == pytest.approx(9 * 2 * math.log(2) / 0.25)
    assert delta_value("1/n", 512) == 1 / 512
    assert delta_value("1/2^n", 512) == 2.0**-512
    assert delta_value("1/2^n", 1074) > 0 and delta_value("1/2^n", 1075) == 0.0  # float64 underflow
    assert delta_value(0.3, 512) == 0.3


def test_check_deltas_accepts_the_rules_and_constants() -> None:
    assert check_deltas(DELTA_RULES) == ("1/2^n", "1/n")
    assert check_deltas(["1/n", 0.5, 0]) == ("1/n", 0.5, 0)


@pytest.mark.parametrize("make, message", [
    (lambda: theorem1_k(-0.1, 512), "strictly between 0 and 1"),
    (lambda: theorem1_k(0.5, 0), "n must be ≥ 1"),
    (lambda: theorem1_bound(1.0, 512, 64), "strictly between 0 and 1"),
    (lambda: jl_failure_bound(0.5, 0), "positive integer"),
    (lambda: theorem2_k(0.5, 512, 0), "n and d must be ≥ 1"),
    (lambda: delta_value("1/n^2", 8), "unknown delta"),
    (lambda: delta_value(-0.5, 8), "unknown delta"),
    (lambda: check_deltas(["1/n", True]), "unknown delta"),
])
def test_bad_input_is_one_line(make, message) -> None:
    with pytest.raises(SpectraError, match=message) as error:
        make()
    assert "\n" not in str(error.value)
