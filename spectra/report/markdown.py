"""How a report page writes its values: two decimals, an interval, a list, a markdown table, a rank.

The report pages (`spectra.pages`) and the README's renderers (analyses/readme_values.py) write numbers the same
way, so a value quoted in the prose and the same value in a page's table read alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from .summaries import interval_digits


def two(value: float) -> str:
    return f"{value:.2f}"


def interval(low: float, high: float) -> str:
    """A 95% interval's ends with as many decimals as it takes for them to differ (never 0.98–0.98)."""
    return "–".join(interval_digits(low, high))


def with_interval(score: float, low: float, high: float) -> str:
    """'0.87 [0.80–0.93]'."""
    return f"{two(score)} [{interval(low, high)}]"


def listed(values: Sequence[Any]) -> str:
    return ", ".join(str(value) for value in values)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def rank_text(rank: Any) -> str:
    """A rank as written in the tables: '—' for a press that did not compress as far as r asks (not ranked)."""
    return "—" if pd.isna(rank) else str(int(rank))


def rank_interval(low: Any, high: Any) -> str:
    """A rank's 95% interval, '3–9' (or '3' where it never moved); '—' for a press without a rank."""
    if pd.isna(low):
        return "—"
    return str(int(low)) if low == high else f"{int(low)}–{int(high)}"


def share(value: float) -> str:
    """A share with two decimals, '—' where there was nothing to average (no answer, no failure)."""
    return "—" if pd.isna(value) else two(value)
