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


@pytest.mark.parametrize("command", COMMANDS + [["cache"], ["heads"]], ids=lambda command: " ".join(command) or "spectra")
def test_help_at_80_columns_keeps_names_defaults_and_readable_descriptions(command, monkeypatch, capsys) -> None:
    """At 80 columns no line is longer, every flag and every default is shown whole (a long default may wrap, never
    be cut with "…"), and descriptions keep at least 40 characters a line (not ~20 beside a wide name column)."""
    import click
    import typer

    from spectra import cli

    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli([*command, "--help"], monkeypatch, capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in out
    group = typer.main.get_command(cli.app)
    target = group.commands[command[0]] if command else group
    whole = "".join(out.split())
    for param in target.params:
        for flag in (*param.opts, *param.secondary_opts):
            assert flag in out.split() or any(word.startswith(flag) for word in out.split()), flag
        shown = param.default
        if isinstance(param, click.Option) and shown not in (None, False, "") and not param.is_flag:
            assert f"[default:{''.join(str(shown).split())}]" in whole, (param.name, shown)
    if not command:  # every command's summary whole, not cut at the first line with "..."
        for name, sub in group.commands.items():
            assert "".join(sub.help.split()) in whole, name
    continuation = [len(line) - len(line.lstrip()) for line in lines if line.startswith("    ") and line.strip()]
    assert max(continuation, default=0) <= 40, "descriptions squeezed into a narrow column"


def test_cache_help_speaks_of_decoders_and_of_its_own_options(monkeypatch, capsys) -> None:
    """Issue 41, item 15: `spectra cache --help` gave an encoder (roberta-base) as its MODEL example, printed
    "[default: ]" for --bytes-kept, called the same thing <scorer> in one place and <decodable> in another, and
    explained --mode by an n that cache does not have."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["cache", "--help"], monkeypatch, capsys)
    assert code == 0, err
    whole = " ".join(out.split())
    assert "roberta-base" not in whole and "A decoder: Hugging Face hub id (HuggingFaceTB/SmolLM2-135M-Instruct)" in whole
    assert "[default: ]" not in whole and "[default:]" not in "".join(out.split())
    assert "decoding(<scorer>)" not in whole and whole.count("decoding(<decodable>)") >= 3
    mode = whole.split("--mode")[1].split("[default: pack]")[0]
    assert " n " not in mode and " n," not in mode and "a sequence's length" in mode


@pytest.mark.parametrize("command", ["cache", "evaluate"])
def test_help_lists_every_press_once_with_what_it_keeps_and_its_kvpress_class(command, monkeypatch, capsys) -> None:
    """Issue 38: after the options, a Presses section lists each press as it is written, what it keeps and the kvpress
    class it equals (or spectra's own), wrapped at 80 columns beside the names as the options are."""
    from spectra.registry import PRESSES

    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli([command, "--help"], monkeypatch, capsys)
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    options, presses = out.split("\nPresses:\n")
    assert "--help" in options and "--help" not in presses
    rows = presses.splitlines()
    starts = [line[2:].split("  ")[0] for line in rows if line.startswith("  ") and not line.startswith("   ")]
    assert starts == PRESSES.listing().split(", ") and len(starts) == len(set(starts)) >= 30
    whole = " ".join(presses.split())
    assert "snapkv the keys the last 64 queries attend to (kvpress: SnapKVPress) tova" in whole
    assert "adakv(<scorer>) a scorer's best tokens, the layer's budget shared by its heads (kvpress: AdaKVPress)" \
        in whole
    assert "loki snapkv's choice, scored in the keys' top principal components (spectra's own)" in whole
    peers = [entry.facts.get("peer") for entry in PRESSES.entries().values()]
    assert whole.count("(kvpress: ") == sum(map(bool, peers)) and whole.count("(spectra's own)") == peers.count(None)
    continuation = {len(line) - len(line.lstrip()) for line in rows[1:] if line.startswith("   ")}
    assert len(continuation) == 1 and min(continuation) <= 34, "descriptions wrap in one column beside the names"


def test_help_of_a_kind_without_listings_ends_with_its_options(monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["analyze", "--help"], monkeypatch, capsys)
    assert code == 0 and out.rstrip().endswith("Show this message and exit."), err
