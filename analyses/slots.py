"""Slots and claims: a document's marked paragraph keeps its prose as text and takes only its values from runs.

A paragraph the numbers machinery owns (between `<!-- numbers: NAME -->` and `<!-- /numbers -->`, see readme.py)
is written by hand, like any other paragraph. Each value it quotes stands in a slot,

    the full cache gives <!--{full_nll}-->3.072<!--/--> nats/token

which a markdown renderer hides (both markers are HTML comments), and each sentence that interprets the values —
an order, a comparison, a "worse than" — is followed by the claim that makes it true,

    Knorm beats random eviction at every ratio.<!--claim: knorm-beats-random-->

The renderer NAME (readme_numbers.py) returns a `Rendered`: the values, already formatted, and the claims it can
decide, each True or False on the runs it read. `fill` puts every value into its slot and says which claims of the
paragraph no longer hold: the prose never changes by itself, so a sentence whose claim fails is reworded by a
person. A value may span lines (a table): it is then set apart by blank lines inside its slot.

The markup lives in the templates (templates/README.md, templates/docs/*.md); the committed README.md and docs/*.md
are their `clean` renders: the values in place, every marker gone, so the files people read are plain markdown.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

#: a slot: its name and what it holds now
SLOT = re.compile(r"<!--\{([A-Za-z0-9_.-]+)\}-->(.*?)<!--/-->", re.S)
#: a claim: its name
CLAIM = re.compile(r"<!--claim: ([A-Za-z0-9_.-]+)-->")
#: a marked paragraph: its opening marker, its body and its closing marker, each marker on a line of its own
MARKED = re.compile(r"^<!-- numbers: \S+ -->\n(.*?)^<!-- /numbers -->\n", re.M | re.S)
#: the markers of a block written from the code (analyses/generated.py), each on a line of its own
GENERATED = re.compile(r"^<!-- (generated: \S+|/generated) -->\n", re.M)
#: the width a rendered paragraph is reflowed to (the documents' own)
WIDTH = 118
#: anything that looks like a slot or a claim marker, well-formed or not
MARKER = re.compile(r"<!--(\{[^}]*\}|claim:?[^>]*|/)-->")


class SlotError(Exception):
    """A paragraph and its renderer disagree on what the paragraph holds (a slot or claim with no value, a value
    with no slot, a slot left open): one line naming the paragraph."""


@dataclass(frozen=True)
class Rendered:
    """What a renderer gives a paragraph: its values (name → text, formatted) and the claims it decides."""

    values: dict[str, str]
    claims: dict[str, bool] = field(default_factory=dict)


def slots(text: str) -> list[str]:
    """The names of the slots in `text`, in order."""
    return [found[1] for found in SLOT.finditer(text)]


def claims(text: str) -> list[str]:
    """The names of the claims in `text`, in order."""
    return [found[1] for found in CLAIM.finditer(text)]


def check_markup(text: str, where: str) -> None:
    """A SlotError when a slot is left open, a closing marker closes nothing, a marker is misspelt, or a slot
    stands inside a code span (where markdown shows the markers as text: the backticks go into the value)."""
    skeleton = SLOT.sub(lambda found: f"<!--{{{found[1]}}}--><!--/-->", text)  # the prose, without the values
    for found in SLOT.finditer(skeleton):
        if skeleton[skeleton.rfind("\n\n", 0, found.start()) + 1:found.start()].count("`") % 2:
            raise SlotError(f"{where}: the slot {{{found[1]}}} stands inside a code span, which shows its markers: "
                            "put the backticks in its value")
    rest = SLOT.sub("", text)
    rest = CLAIM.sub("", rest)
    for found in MARKER.finditer(rest):
        marker = found[0]
        if marker.startswith("<!--{"):
            raise SlotError(f"{where}: the slot {marker} is never closed (<!--/-->)")
        if marker == "<!--/-->":
            raise SlotError(f"{where}: a <!--/--> closes no slot")
        raise SlotError(f"{where}: a claim reads '<!--claim: NAME-->', not '{marker}'")


def fill(text: str, rendered: Rendered, where: str) -> tuple[str, list[str]]:
    """`text` with every slot holding its rendered value, and the names of its claims that do not hold.

    A slot or claim the renderer does not give is a SlotError. A renderer may give more than its paragraph shows
    (the claims for either outcome, values a rewording may want)."""
    check_markup(text, where)
    named, asserted = slots(text), claims(text)
    missing = [name for name in named if name not in rendered.values]
    if missing:
        raise SlotError(f"{where}: the slot {{{missing[0]}}} has no value (the renderer gives "
                        f"{', '.join(sorted(rendered.values)) or 'none'})")
    undecided = [name for name in asserted if name not in rendered.claims]
    if undecided:
        raise SlotError(f"{where}: the claim '{undecided[0]}' is not one the renderer decides (it decides "
                        f"{', '.join(sorted(rendered.claims)) or 'none'})")

    def value(found: re.Match) -> str:
        text = rendered.values[found[1]]
        if " ".join(text.split()) == " ".join(found[2].split()):
            return found[0]  # the same value, perhaps wrapped over two lines by hand: left as it stands
        if "\n" in text:
            text = "\n\n" + text.strip("\n") + "\n\n"
        return f"<!--{{{found[1]}}}-->{text}<!--/-->"

    return SLOT.sub(value, text), [name for name in dict.fromkeys(asserted) if not rendered.claims[name]]


def line_of(text: str, claim: str) -> int:
    """The 0-based line of `text` on which the claim `claim` first stands."""
    return text[:text.index(f"<!--claim: {claim}-->")].count("\n")


def clean(text: str) -> str:
    """A template as people read it: in each marked paragraph every slot replaced by its value (a value set apart by
    blank lines keeps one blank line on each side), every claim removed and the prose reflowed to `WIDTH` columns
    (the markers made its lines ragged); the paragraph markers removed."""
    def paragraph(found: re.Match) -> str:
        body = found[1]
        check_markup(body, f"the marked paragraph '{found[0].split()[2]}'")
        body = SLOT.sub(lambda slot: slot[2].strip("\n") if "\n" in slot[2].strip("\n") else slot[2], body)
        return "\n\n".join(reflow(block) for block in CLAIM.sub("", body).split("\n\n"))

    return GENERATED.sub("", MARKED.sub(paragraph, text))


def reflow(block: str) -> str:
    """A block of prose as lines of at most `WIDTH` characters, words kept whole; a table, list, quote, heading or
    code block is left as it stands."""
    lines = block.splitlines()
    if not lines or any(line.lstrip().startswith(("|", "- ", "* ", "#", ">", "```", "    ")) or
                        re.match(r"\s*\d+\. ", line) for line in lines):
        return block
    trailing = block[len(block.rstrip("\n")):]
    return textwrap.fill(" ".join(line.strip() for line in lines), WIDTH, break_long_words=False,
                         break_on_hyphens=False) + trailing
