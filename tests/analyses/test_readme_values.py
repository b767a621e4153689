"""analyses/readme_values.py: how the renderers write values (significant figures, ranges, intervals, tables)."""

from __future__ import annotations

import readme_values as fmt  # noqa: E402  (conftest.py puts analyses/ on the path)

sig, span, two = fmt.sig, fmt.span, fmt.two


def test_formatting() -> None:
    assert [sig(x) for x in (70.04, 137.2, 3672.0, 0.0041234, 0.0)] == ["70.0", "137", "3670", "0.00412", "0"]
    assert span([0.2, 0.5], two) == "0.20–0.50" and span([0.5, 0.501], two) == "0.50"
    assert fmt.interval(0.981, 0.984) == "0.981–0.984" and fmt.count(1, "sequence") == "one sequence"
    assert fmt.table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
