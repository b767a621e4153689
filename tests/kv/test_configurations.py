"""kvpress's evaluation registry as spectra configurations: every entry either resolves (torch-free, its settings
declared fields of presses its expression holds) and builds the press it names, or says in one line what to write
instead; the leaderboard's presets; the names refused before anything loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spectra import registry
from spectra.errors import SpectraError
from spectra.kv import configurations
from spectra.kv.configurations import PREFIX, PRESETS, REGISTRY, Configuration, check
from spectra.registry import PRESSES


def test_every_entry_resolves_or_says_what_to_write_instead() -> None:
    for name, entry in REGISTRY.items():
        if entry.expression:
            facts = PRESSES.facts(entry.written)
            assert facts["peer"] == entry.kvpress and facts["summary"].startswith(f"kvpress's {name}: ")
            assert entry.written in PRESSES
        else:
            assert entry.instead
            with pytest.raises(SpectraError) as refused:
                PRESSES.facts(entry.written)
            assert str(refused.value) == f"press '{entry.written}' ({entry.kvpress}): {entry.instead}"
            assert entry.written not in PRESSES


def test_the_configurations_kvpress_names() -> None:
    """The entries issue 51 names, as kvpress's registry configures them."""
    assert (REGISTRY["expected_attention"].expression, dict(REGISTRY["expected_attention"].settings)) == (
        "adakv(expected_attention)", {"expected_attention": {"epsilon": 0.01}})
    assert REGISTRY["critical_expected_attention"].settings == {"expected_attention": {"use_vnorm": False}}
    assert REGISTRY["chunkkv"].settings == {"chunkkv": {"chunk_length": 20}}
    assert REGISTRY["block_keydiff"].settings == {"block": {"block_size": 128}}
    assert REGISTRY["snap_think"].expression == "composed(snapkv,think)"
    assert REGISTRY["adakv_compactor"].expression == "adakv(compactor)"
    assert PRESSES.facts("kvpress:expected_attention")["needs_rope"], "the expression's facts"
    assert "fields" not in PRESSES.facts("kvpress:expected_attention"), "a class's fields are not its wrapper's"


def test_the_presses_built_carry_the_settings_and_leave_the_registered_ones() -> None:
    press = PRESSES["kvpress:expected_attention"]
    assert type(press).__name__ == "AdaKV" and press.inner.epsilon == 0.01 and press.inner.use_vnorm
    assert PRESSES["kvpress:critical_adakv_expected_attention"].inner.use_vnorm is False
    assert PRESSES["kvpress:chunkkv"].chunk_length == 20 and type(PRESSES["kvpress:chunkkv"].inner).__name__ == "SnapKV"
    assert [type(inner).__name__ for inner in PRESSES["kvpress:snap_think"].inner] == ["SnapKV", "ThinK"]
    assert PRESSES["kvpress:merging_expected_attention"].inner.epsilon == 0.01
    assert PRESSES["expected_attention"].epsilon == 0.0 and PRESSES["adakv(expected_attention)"].inner.epsilon == 0.0
    assert PRESSES["kvpress:expected_attention"] is PRESSES["kvpress:expected_attention"], "built once"


def test_a_setting_the_expression_cannot_take_is_refused() -> None:
    with pytest.raises(SpectraError, match="its settings name knorm, which adakv\\(snapkv\\) does not hold"):
        check(Configuration("x", "X()", "adakv(snapkv)", {"knorm": {"epsilon": 0.1}}), PRESSES)
    with pytest.raises(SpectraError, match="declares no setting eps=0.1"):
        check(Configuration("x", "X()", "adakv(expected_attention)", {"expected_attention": {"eps": 0.1}}), PRESSES)
    with pytest.raises(SpectraError, match="declares no setting use_vnorm=0"):
        check(Configuration("x", "X()", "expected_attention", {"expected_attention": {"use_vnorm": 0}}), PRESSES)


def test_the_leaderboard_presets() -> None:
    question_free, query_aware = PRESETS["kvpress-leaderboard-question-free"], PRESETS["kvpress-leaderboard-query-aware"]
    assert query_aware == ("kvpress:snapkv", "kvpress:adakv_snapkv", "kvpress:finch", "kvpress:chunkkv")
    assert question_free[:4] == ("kvpress:random", "kvpress:knorm", "kvpress:snapkv", "kvpress:expected_attention")
    assert PRESETS["kvpress-leaderboard"] == tuple(dict.fromkeys(question_free + query_aware))
    assert set(configurations.left_out()) == {"qfilter", "kvzap_linear", "kvzap_mlp", "duo_attention",
                                              "duo_attention_on_the_fly"}
    assert len(question_free) + len(configurations.left_out()) == len(configurations.QUESTION_FREE)
    assert registry.press_names(["kvpress-leaderboard-query-aware", "knorm"]) == (*query_aware, "knorm")


@pytest.mark.parametrize("names, message", [
    (["kvpress:nope"], "unknown press 'kvpress:nope': kvpress 0.5.5's evaluation registry has adakv_snapkv"),
    (["kvpress:qfilter"], "kvpress downloads the Q-Filters .* names it qfilter\\(DIR\\)"),
    (["adakv_snapkv"], "a name of kvpress's evaluation registry: write kvpress:adakv_snapkv"),
    (["adakv_expected_attention_e2"], "before 0.4.1: write kvpress:expected_attention"),
    (["kvpress:adakv_expected_attention_e2"], "names this configuration kvpress:expected_attention"),
    (["kvpress-leaderbord"], "unknown press 'kvpress-leaderbord'; valid presses: .*kvpress-leaderboard, "),
])
def test_bad_names_are_one_line(names, message) -> None:
    with pytest.raises(SpectraError, match=message):
        registry.press_names(names)


def test_the_command_refuses_an_unknown_preset_before_the_model_loads(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "spectra", "evaluate", str(tmp_path / "no-model"), "--data",
                           str(tmp_path / "no-tasks.jsonl"), "--presses", "kvpress-leaderbord"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "kvpress-leaderbord" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr and len((done.stderr + done.stdout).strip().splitlines()) == 1
