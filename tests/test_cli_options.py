"""The command line's shared vocabulary: --help shows each option as a user types it (no "<bool>" beside a flag,
which takes no value, and no "95%%" from a format escape the help never goes through)."""

from __future__ import annotations

import pytest
from tiny import run_cli

COMMANDS = [[], ["analyze"], ["approx"], ["theorems"], ["scaling"], ["plot"], ["figure1"], ["plan-k"], ["compare"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(command) or "spectra")
def test_help_shows_flags_without_a_type_and_percent_signs_once(command, monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = run_cli([*command, "--help"], monkeypatch, capsys)
    assert code == 0 and "--help" in out, err
    assert "<bool>" not in out and "%%" not in out
    help_line = next(line for line in out.splitlines() if "--help" in line)
    assert help_line.split("--help")[1].split()[0] == "Show", "no type between a flag and its help"
    if command == ["theorems"]:
        assert "comes with a 95% interval" in " ".join(out.split())
