"""kvpress's evaluation registry as spectra configurations: every entry either resolves (torch-free, its settings
declared fields of presses its expression holds) and builds the press it names, or says in one line what to write
instead; the leaderboard's presets; the names refused before anything loads."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from spectra import registry
from spectra.errors import SpectraError
from spectra.kv import configurations
from spectra.kv.configurations import PREFIX, PRESETS, REGISTRY, Configuration, check
from spectra.registry import PRESSES


def test_every_entry_resolves_or_says_what_to_write_instead() -> None:
    for name, entry in REGISTRY.items():
        if entry.parameters:  # kvpress:kvzap_mlp(<artifact>,<threshold>): written without them, one line saying so
            with pytest.raises(SpectraError) as refused:
                PRESSES.facts(PREFIX + name)
            assert str(refused.value).startswith(f"press '{PREFIX}{name}' ({entry.kvpress}): write {entry.written} (")
        elif entry.expression:
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


def test_the_kvzap_entries_take_their_surrogate_and_threshold(tmp_path) -> None:
    """kvpress's leaderboard runs DMSPress(KVzapPress(model_type=…)) by threshold (leaderboard.sh); spectra writes it
    kvpress:kvzap_linear(DIR,-6): the surrogate kvpress downloads is the one `spectra artifacts kvzap` fitted, of the
    model_type the entry names (checked), the press dms(kvzap(DIR),-6)."""
    from spectra.kv.presses import REGISTRY as PRESS_OBJECTS

    from .presses.test_kvzap import with_hidden, write_surrogate

    linear, _ = write_surrogate(tmp_path / "linear", None)
    mlp, _ = write_surrogate(tmp_path / "mlp", 5)
    name = f"kvpress:kvzap_linear({linear},-6)"
    facts = PRESSES.facts(name)
    assert facts["hidden"] and facts["peer"] == "DMSPress(press=KVzapPress(model_type='linear'))"
    assert facts["summary"] == f"kvpress's kvzap_linear: dms(kvzap({linear}),-6)" and name in PRESSES
    press = PRESSES[name]
    assert type(press).__name__ == "DMS" and press.threshold == -6.0 and press.inner.where == linear
    prefill, _ = with_hidden(1, length=200)
    same = PRESS_OBJECTS[f"dms(kvzap({linear}),-6)"]
    assert torch.equal(press.compress(prefill, 0.5).kept, same.compress(prefill, 0.5).kept)
    assert type(PRESSES[f"kvpress:kvzap_mlp({mlp},-4.5)"]).__name__ == "DMS"
    assert type(PRESSES[f"kvpress:kvzap_mlp_head({mlp})"]).__name__ == "KVzap"
    layer = PRESSES[f"kvpress:kvzap_mlp_layer({mlp})"]
    assert type(layer).__name__ == "AdaKV" and type(layer.inner).__name__ == "KVzap"
    assert PRESSES.facts(f"kvpress:kvzap_mlp_layer({mlp})")["hidden"]
    assert type(PRESSES[f"kvpress:merging_kvzap_mlp({mlp})"].inner).__name__ == "KVzap"
    assert REGISTRY["kvzap_mlp"].written == "kvpress:kvzap_mlp(<artifact>,<threshold>)"
    assert configurations.THRESHOLDS["Qwen/Qwen3-8B"] == (-3, -4, -5, -6)
    assert configurations.THRESHOLDS["meta-llama/Llama-3.1-8B-Instruct"] == (-6, -7, -8, -9)
    assert configurations.THRESHOLDS["HuggingFaceTB/SmolLM2-135M-Instruct"] == (0, -2, -4, -6)  # RESULTS §28
    for written, message in (
            (f"kvpress:kvzap_mlp({linear},-6)", f"model_type 'mlp', and the one in {linear} is 'linear'"),
            (f"kvpress:kvzap_linear({mlp},-6)", f"model_type 'linear', and the one in {mlp} is 'mlp'"),
            ("kvpress:kvzap_mlp", "write kvpress:kvzap_mlp(<artifact>,<threshold>) (<artifact>: the KVzap surrogate "
                                  "directory `spectra artifacts kvzap MODEL"),
            (f"kvpress:kvzap_mlp({mlp})", "write kvpress:kvzap_mlp(<artifact>,<threshold>)"),
            (f"kvpress:kvzap_mlp({mlp},abc)", f"press 'dms(kvzap({mlp}),abc)': its threshold 'abc' is not a finite"),
            ("kvpress:kvzap_mlp(/no/such/dir,-6)", "KVzap surrogate /no/such/dir: no such directory"),
            ("kvpress:knorm(x)", "press 'kvpress:knorm(x)' (KnormPress()): write kvpress:knorm, without parentheses")):
        with pytest.raises(SpectraError) as refused:
            registry.press_names([written])
        assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
