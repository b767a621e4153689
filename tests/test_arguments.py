"""The grammar of names taking several arguments: the kinds a `several` fact gives each count of arguments, how the
name is written in listings, and how its arguments' facts merge."""

from __future__ import annotations

import pytest

from spectra.arguments import (called_empty, either, kinds_of, merge_fact, needed, not_one, number_of, several_kinds,
                               written)
from spectra.errors import SpectraError


def test_the_kinds_of_each_count_of_arguments() -> None:
    assert several_kinds("scorer,decodable", 2) == ("scorer", "decodable")
    assert several_kinds("scorer,decodable", 1) is None and several_kinds("scorer,decodable", 3) is None
    assert several_kinds("press,press…", 2) == ("press", "press") and several_kinds("press,press…", 4) == ("press",) * 4
    assert several_kinds("press,press…", 1) is None and several_kinds("", 2) is None
    assert kinds_of("press,press…") == ["press", "press"] and kinds_of("") == []


def test_how_a_name_is_written() -> None:
    assert written("adakv", "scorer", "") == "adakv(<scorer>)"
    assert written("composed", "", "press,press…") == "composed(<press>,<press>,...)"
    assert written("prefill_decoding", "decodable", "scorer,decodable") == (
        "prefill_decoding(<decodable>) or prefill_decoding(<scorer>,<decodable>)")
    assert written("dms", "scorer", "", "threshold") == "dms(<scorer>,<threshold>)"


def test_a_number_after_the_press() -> None:
    """dms(<scorer>,<threshold>): the press (itself written with parentheses and commas), then one finite number."""
    assert number_of("dms(kvzap(a,b),-6)", "kvzap(a,b),-6", "threshold") == ("kvzap(a,b)", -6.0)
    assert number_of("dms(knorm, 1e-2 )", "knorm, 1e-2 ", "threshold") == ("knorm", 0.01)
    for argument, message in (("knorm", "dms takes the press it wraps and then one threshold, e.g. dms(knorm,-6)"),
                              ("knorm,-6,2", "then one threshold"), (",-6", "e.g. dms(knorm,-6)"),
                              ("knorm,x", "its threshold 'x' is not a finite number"),
                              ("knorm,-inf", "its threshold '-inf' is not a finite number"),
                              ("knorm(,-6", "leaves a parenthesis open")):
        with pytest.raises(SpectraError, match=message.replace("(", "\\(").replace(")", "\\)")):
            number_of(f"dms({argument})", argument, "threshold")


def test_facts_merge_as_flags_any_numbers_largest_text_first() -> None:
    merged: dict = {}
    for facts in ({"windowed": True, "window": 64, "axis": "tokens"}, {"window": 32, "needs_rope": True,
                                                                        "axis": "channels", "windowed": False}):
        for key, value in facts.items():
            merged[key] = merge_fact(merged.get(key), value)
    assert merged == {"windowed": True, "window": 64, "axis": "tokens", "needs_rope": True}


def test_a_refusal_of_arguments_is_said_in_words() -> None:
    """Issue 55, item 7: what refused arguments do, in words (a fact without words is named as it is); what a name
    written with empty parentheses needs, with an example."""
    said = {"loud": "makes noise", "slow": "takes long"}
    assert either(said, ["loud"]) == "makes noise" and either(said, ["loud", "slow", "odd"]) == (
        "makes noise, takes long or is odd")
    assert not_one(said, ["loud", "slow"], False) == "not one: it makes noise and takes long"
    assert not_one(said, [], True) == "not one: it is written with an argument" and not_one(said, [], False) == "not one"
    assert called_empty("adakv()") == "adakv" and called_empty(" adakv( ) ") == "adakv"
    assert called_empty("adakv(snapkv)") is None and called_empty("adakv") is None
    assert needed("adakv", "press", "scorer", ["knorm", "snapkv"], 1, "adakv(<scorer>)") == (
        "adakv needs a scorer press as its argument, e.g. adakv(knorm); scorers: knorm, snapkv")
    assert needed("composed", "press", "press", ["a", "b", "c"], 2, "composed(<press>,<press>,...)") == (
        "composed needs presses as its arguments, e.g. composed(a,b): composed(<press>,<press>,...)")
    assert needed("duo", "press", "", [], 1, "duo(<pattern>)") == "duo needs an argument: duo(<pattern>)"
