"""How a page writes a value: an interval's ends always differ where the values do, a missing rank is a dash."""

from __future__ import annotations

import pandas as pd

from spectra.report.markdown import interval, rank_interval, rank_text, share, table, with_interval


def test_values_are_written_as_the_pages_quote_them() -> None:
    assert interval(0.981, 0.984) == "0.981–0.984" and interval(0.5, 0.5) == "0.50–0.50"
    assert with_interval(0.875, 0.5, 1.0) == "0.88 [0.50–1.00]"
    assert rank_text(pd.NA) == "—" and rank_text(3) == "3"
    assert rank_interval(pd.NA, pd.NA) == "—" and rank_interval(2, 2) == "2" and rank_interval(2, 5) == "2–5"
    assert share(float("nan")) == "—" and share(0.125) == "0.12"
    assert table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
