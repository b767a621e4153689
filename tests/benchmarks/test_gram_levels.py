"""benchmarks/gram_levels.py: which matrices of the Figure 1 workload's random encoder fail the Gram bound, and the
Jordan–Wielandt level's error on them against scipy — run on a short sequence."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gram_levels.py"


@pytest.mark.slow  # a RoBERTa-base-shaped model (110 M parameters) built and run on the CPU
def test_the_random_encoders_collapsed_heads_fail_the_gram_bound_and_not_the_jordan_one(monkeypatch, capsys) -> None:
    spec = importlib.util.spec_from_file_location("gram_levels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["gram_levels.py", "--length", "48", "--model", "/nonexistent", "--show", "3"])
    module.main()
    out = capsys.readouterr().out
    failing = [int(count) for count in re.findall(r"tolerance 1e-06: (\d+) of 144 fail", out)]
    assert failing and failing[0] > 0, out
    rows = [line.split("|")[2:6] for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 3, out
    for gram_bound, gram_error, jordan_bound, jordan_error in ([float(x) for x in row] for row in rows):
        assert gram_bound > 5e-7 and gram_error <= gram_bound  # the Gram bound holds, and is what fails
        assert jordan_error <= jordan_bound < 5e-7  # the Jordan–Wielandt bound holds, and passes
