"""The grammar of names taking several arguments: the kinds a `several` fact gives each count of arguments, how the
name is written in listings, and how its arguments' facts merge."""

from __future__ import annotations

from spectra.arguments import kinds_of, merge_fact, several_kinds, written


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


def test_facts_merge_as_flags_any_numbers_largest_text_first() -> None:
    merged: dict = {}
    for facts in ({"windowed": True, "window": 64, "axis": "tokens"}, {"window": 32, "needs_rope": True,
                                                                        "axis": "channels", "windowed": False}):
        for key, value in facts.items():
            merged[key] = merge_fact(merged.get(key), value)
    assert merged == {"windowed": True, "window": 64, "axis": "tokens", "needs_rope": True}
