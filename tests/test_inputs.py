"""What the front ends accept before the options are checked: comma-separated lists (command line), one value or
several and paths as str or os.PathLike (Python), and defaults that say they were defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectra.errors import SpectraError, spell
from spectra.inputs import budgets_or_default, items, numbers, path_text, several, split_top


def test_one_value_or_several() -> None:
    assert several(64, "--budget") == (64,) and several([64, 8], "--budget") == (64, 8) and several((8,), "--budget") == (8,)
    assert several("svd", "--methods") == ("svd",)
    assert several("svd, linformer(kv)", "--methods") == ("svd", "linformer(kv)"), "a label keeps its parentheses"
    assert several(["svd", "jl"], "--methods") == ("svd", "jl")
    assert several(0.1, "--eps", float) == (0.1,) and several("0.1,0.3", "--eps", float) == (0.1, 0.3)
    assert several("32,64", "--budget", int) == (32, 64) and several(range(3), "--layers") == (0, 1, 2)
    with pytest.raises(SpectraError, match="^presses takes one value or several, got None; leave it out for its "
                                           "default$"):
        several(None, "--presses")  # the API's spelling: spectra.cache(…, presses=None) once raised AttributeError
    with pytest.raises(SpectraError) as raised:
        several("a,b", spell("--budget"), int)
    assert str(raised.value).startswith("budget 'a,b' is not a comma-separated list of integers")
    assert raised.value.for_cli().startswith("--budget 'a,b' is not a comma-separated list of integers")


def test_numbers_read_the_command_line_lists() -> None:
    assert numbers("32, 64,128", "--budget") == [32, 64, 128] and numbers("0.1,0.5", "--eps", float) == [0.1, 0.5]
    assert numbers("", "--budget") == []


def test_paths_may_be_str_or_pathlike() -> None:
    assert path_text(Path("runs") / "a") == "runs/a" and path_text("runs/a") == "runs/a" and path_text(None) is None


def test_a_default_that_does_not_fit_says_it_was_the_default() -> None:
    assert budgets_or_default(None, (16, 32), 64) == (16, 32) and budgets_or_default(8, (128,), 64) == (8,)
    assert budgets_or_default("8,16", (128,), 64) == (8, 16)
    with pytest.raises(SpectraError) as raised:
        budgets_or_default(None, (128,), 64)
    assert raised.value.for_cli() == ("--budget defaults to 128, more than --length 64; pass --budget ≤ 64, e.g. "
                                      "--budget 16")
    assert str(raised.value) == "budget defaults to (128,), more than length=64; pass budget ≤ 64, e.g. budget=16"
    with pytest.raises(SpectraError) as raised:
        budgets_or_default(None, (16, 32, 64, 128, 256), 40)
    assert raised.value.for_cli().endswith("e.g. --budget 16,32") and str(raised.value).endswith("e.g. budget=(16, 32)")


@pytest.mark.parametrize("text", ["0.5,,0.7", "0.5,", ",0.5", " , "])
def test_an_empty_item_in_a_list_is_one_line(text) -> None:
    """Issue 41, item 15: `--tasks passkey,,` and `--length 1024,` were accepted, an empty item dropped without a
    word; a typo between commas is refused (an option given empty is still no value)."""
    with pytest.raises(SpectraError, match="has an empty item: separate its values by single commas"):
        several(text, "--ratios", float)
    assert several("", "--bytes-kept", float) == () and several("a, b", "--presses") == ("a", "b")


def test_commas_inside_parentheses_belong_to_their_item() -> None:
    """`--presses composed(snapkv,knorm),knorm` is two presses; unbalanced parentheses are one line naming the
    option."""
    assert items("composed(snapkv,knorm), knorm,adakv(snapkv)", "--presses") == [
        "composed(snapkv,knorm)", "knorm", "adakv(snapkv)"]
    assert split_top("a(b(c,d),e), f") == ["a(b(c,d),e)", "f"] and items("32,64", "--budget") == ["32", "64"]
    for text, message in (("composed(snapkv,knorm", "leaves a parenthesis open"),
                          ("knorm),snapkv", "closes a parenthesis it never opened")):
        with pytest.raises(SpectraError, match=message) as caught:
            items(text, "--presses")
        assert "\n" not in str(caught.value)


def test_utf8_names_the_first_bad_byte_and_its_line() -> None:
    from spectra.errors import SpectraError
    from spectra.inputs import utf8

    assert utf8("é\n".encode(), "f", "fix it") == "é\n"
    with pytest.raises(SpectraError, match=r"^f is not UTF-8 text \(byte 0xff on line 2\); fix it$"):
        utf8(b"ok\n\xff", "f", "fix it")
