"""The Linformer paper's bounds (Theorems 1 and 2) and Theorem 2's δ, with natural logs throughout.

Conventions (documented choices):
- log is the NATURAL log in every formula (k(ε, n) = 5 ln n / (ε² − ε³); n = 512, ε = 0.5 gives ≈ 249.5).
- Theorem 2's k = min{9 d ln d / ε², 5 ln n / ε²} takes the Θ(·) constants as 1; the paper gives none.
- Theorem 2's δ may be a constant or a rule of the sequence length: "1/2^n" (appendix B) and "1/n"
  (its θ(1/n)), evaluated per sequence at its valid length. 2^-n underflows to 0.0 in float64 for
  n ≥ 1075 (and in float32 for n ≥ 150, where the probe computes); any δ below ~1e-8 makes
  softmax(w δRᵀ) exactly uniform in floating point, so the probe then measures the δ → 0 limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..config import check_budget, check_eps
from ..errors import SpectraError

DELTA_RULES = ("1/2^n", "1/n")


def _gap(eps: float) -> float:
    check_eps(eps)
    return eps**2 - eps**3


def jl_failure_bound(eps: float, budget: int) -> float:
    """The JL lemma's failure probability bound 2 e^{−(ε²−ε³) k/4} (may exceed 1: then it says nothing)."""
    return 2.0 * math.exp(-_gap(eps) * check_budget(budget) / 4.0)


def theorem1_k(eps: float, n: int) -> float:
    """Theorem 1's k = 5 ln n / (ε² − ε³)."""
    if n < 1:
        raise SpectraError(f"n must be ≥ 1, got {n}")
    return 5.0 * math.log(n) / _gap(eps)


def theorem1_bound(eps: float, n: int, budget: int) -> float:
    """Theorem 1's success probability bound max(0, 1 − 2n e^{−(ε²−ε³) k/4}) (the proof's union bound)."""
    if n < 1:
        raise SpectraError(f"n must be ≥ 1, got {n}")
    return max(0.0, 1.0 - n * jl_failure_bound(eps, budget))


def theorem2_k(eps: float, n: int, d: int) -> float:
    """Theorem 2's k = min{9 d ln d / ε², 5 ln n / ε²}, the Θ(·) constants taken as 1."""
    check_eps(eps)
    if n < 1 or d < 1:
        raise SpectraError(f"n and d must be ≥ 1, got n = {n} and d = {d}")
    return min(9.0 * d * math.log(d), 5.0 * math.log(n)) / eps**2


def delta_value(rule: str | float, n: int) -> float:
    """Theorem 2's δ for a sequence of n tokens: "1/2^n" (0.0 once it underflows), "1/n", or a constant."""
    if rule == "1/2^n":
        return math.ldexp(1.0, -n)
    if rule == "1/n":
        return 1.0 / n
    if isinstance(rule, (int, float)) and not isinstance(rule, bool) and rule >= 0:
        return float(rule)
    raise SpectraError(f"unknown delta {rule!r}; use '1/2^n', '1/n' or a non-negative number")


def check_deltas(deltas: Sequence[str | float]) -> tuple[str | float, ...]:
    values = tuple(deltas)
    for value in values:
        delta_value(value, 1)
    return values
