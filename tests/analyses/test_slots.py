"""analyses/slots.py: a paragraph's values go into its slots and nowhere else, its prose never changes, a claim that
no longer holds is named, and a paragraph that disagrees with its renderer is a one-line error."""

from __future__ import annotations

import pytest

from .conftest import load

slots = load("slots")
Rendered = slots.Rendered

PARAGRAPH = ("The full cache gives <!--{nll}-->3.072<!--/--> nats/token over <!--{scored}-->16<!--/--> sequences.\n"
             "Knorm beats random eviction at every ratio.<!--claim: knorm-beats-random-->\n")


def test_values_fill_their_slots_and_the_prose_stays() -> None:
    text, failed = slots.fill(PARAGRAPH, Rendered({"nll": "3.100", "scored": "4"}, {"knorm-beats-random": True}), "x")
    assert text == PARAGRAPH.replace("3.072", "3.100").replace(">16<", ">4<")
    assert failed == []
    assert slots.slots(PARAGRAPH) == ["nll", "scored"] and slots.claims(PARAGRAPH) == ["knorm-beats-random"]


def test_a_claim_that_no_longer_holds_is_named_and_its_line_found() -> None:
    text, failed = slots.fill(PARAGRAPH, Rendered({"nll": "3.1", "scored": "4"}, {"knorm-beats-random": False}), "x")
    assert failed == ["knorm-beats-random"]
    assert "Knorm beats random eviction at every ratio." in text, "the sentence is not reworded by code"
    assert slots.line_of(PARAGRAPH, "knorm-beats-random") == 1


def test_a_slot_may_repeat_and_a_renderer_may_give_more_than_the_paragraph_shows() -> None:
    text, _ = slots.fill("k = <!--{k}-->1<!--/--> and again <!--{k}-->2<!--/-->", Rendered({"k": "8", "n": "5"}), "x")
    assert text == "k = <!--{k}-->8<!--/--> and again <!--{k}-->8<!--/-->"


def test_a_value_wrapped_by_hand_stays_wrapped_while_it_holds() -> None:
    text = "among <!--{methods}-->`window, nystrom,\npool-mean`<!--/--> and"
    assert slots.fill(text, Rendered({"methods": "`window, nystrom, pool-mean`"}), "x")[0] == text
    assert slots.fill(text, Rendered({"methods": "`window, jl`"}), "x")[0] == "among <!--{methods}-->`window, jl`<!--/--> and"


def test_a_table_stands_apart_by_blank_lines() -> None:
    table = "| press | r = 0.5 |\n|---|---|\n| knorm | 3.312 |"
    text, _ = slots.fill("NLL:\n\n<!--{table}-->\n\nold\n\n<!--/-->\n\nAfter.", Rendered({"table": table}), "x")
    assert text == f"NLL:\n\n<!--{{table}}-->\n\n{table}\n\n<!--/-->\n\nAfter."
    again, _ = slots.fill(text, Rendered({"table": table}), "x")
    assert again == text, "filling twice changes nothing"


@pytest.mark.parametrize("text, rendered, message", [
    ("a <!--{x}-->1<!--/-->", Rendered({}), r"the slot \{x\} has no value"),
    ("a<!--claim: c-->", Rendered({}, {"d": True}), "the claim 'c' is not one the renderer decides"),
    ("a <!--{x}-->1 and no end", Rendered({"x": "1"}), r"the slot <!--\{x\}--> is never closed"),
    ("a <!--/--> b", Rendered({}), "closes no slot"),
    ("a<!--claim c-->", Rendered({}), "a claim reads '<!--claim: NAME-->'"),
    ("in `code <!--{x}-->1<!--/--> span`", Rendered({"x": "1"}), "inside a code span"),
    ("in `code\nspan <!--{x}-->1<!--/-->` over two lines", Rendered({"x": "1"}), "inside a code span"),
])
def test_a_paragraph_and_its_renderer_that_disagree_are_one_line_errors(text, rendered, message) -> None:
    with pytest.raises(slots.SlotError, match=message) as raised:
        slots.fill(text, rendered, "README.md:12 (name)")
    assert str(raised.value).startswith("README.md:12 (name): ") and "\n" not in str(raised.value)


def test_backticks_inside_values_do_not_count_as_code_spans() -> None:
    text = "the winners are <!--{w}-->`window` 35,\n`pool` 3<!--/--> and <!--{k}-->8<!--/-->"
    filled, _ = slots.fill(text, Rendered({"w": "`window` 30, `pool` 8", "k": "16"}), "x")
    assert filled == "the winners are <!--{w}-->`window` 30, `pool` 8<!--/--> and <!--{k}-->16<!--/-->"


def test_clean_leaves_values_and_prose_and_drops_every_marker() -> None:
    """Issue 37, item 7: a template renders to plain markdown: values in place, claims and paragraph markers gone, the
    prose reflowed (the markers made its lines ragged), a table value kept apart by one blank line each side."""
    template = ("# Title\n\nKept as it is,\nshort lines and all.\n\n<!-- numbers: a -->\n" + PARAGRAPH +
                "It reads:\n\n<!--{table}-->\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<!--/-->\n\nThe end.\n"
                "<!-- /numbers -->\n\nAfter.\n")
    assert slots.clean(template) == (
        "# Title\n\nKept as it is,\nshort lines and all.\n\nThe full cache gives 3.072 nats/token over 16 "
        "sequences. Knorm beats random eviction at every ratio. It reads:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "The end.\n\nAfter.\n")
    long = "<!-- numbers: a -->\n" + " ".join(["word"] * 60) + "<!--{x}-->1<!--/-->\n<!-- /numbers -->\n"
    assert max(map(len, slots.clean(long).splitlines())) <= slots.WIDTH
    with pytest.raises(slots.SlotError, match="never closed"):
        slots.clean("<!-- numbers: a -->\nan <!--{open}-->slot\n<!-- /numbers -->\n")
