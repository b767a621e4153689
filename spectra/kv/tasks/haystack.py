"""What the synthetic tasks hide their needles in, and the words they draw: RULER's haystacks, made offline.

RULER has three haystacks: `noise` (one paragraph of filler sentences repeated, one per line), `essay` (Paul Graham's
essays, downloaded: here any local text file, `--haystack FILE`, cut into words as RULER cuts the essays and into
sentences where the needles go) and `needle` (the needles' own sentence with random keys and values: distractors).
Needles are inserted between units (lines or sentences) at a depth: a fraction of the units before them.

Word lists come from the `wonderwords` package, as in RULER: its noun, adjective and verb lists (one entry a line).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import SpectraError

#: RULER's noise haystack (and the landmark-attention passkey's garbage): one line of it per unit
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
#: the end of a sentence: . ! or ? (closing quotes or brackets allowed) followed by white space (RULER uses nltk's
#: punkt; this splitter cuts at the same places in ordinary prose, and places needles only between sentences)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


@functools.cache
def word_list(name: str) -> tuple[str, ...]:
    """The wonderwords list `name` (noun, adjective or verb): its entries in file order, duplicates removed."""
    try:
        from importlib.resources import files

        text = (files("wonderwords") / "assets" / f"{name}list.txt").read_text(encoding="utf-8")
    except (ImportError, ModuleNotFoundError, OSError):
        raise SpectraError("spectra tasks draws its words from the wonderwords package, as RULER does: "
                           "pip install wonderwords") from None
    return tuple(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))


def niah_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(adjectives, nouns), sorted: a niah key word is "adjective-noun" as in RULER, drawn as a uniform pair."""
    return tuple(sorted(word_list("adjective"))), tuple(sorted(word_list("noun")))


def common_words() -> tuple[str, ...]:
    """RULER's cwe vocabulary: nouns, adjectives and verbs, deduplicated and sorted (the task shuffles them)."""
    return tuple(sorted(set(word_list("noun")) | set(word_list("adjective")) | set(word_list("verb"))))


@dataclass(frozen=True)
class Haystack:
    """The essay stand-in: `words` of a local text file (white space collapsed, split on spaces, as RULER splits
    the essays), or None for RULER's noise haystack in its place. `name` describes it for the records' source."""

    words: tuple[str, ...] | None
    name: str

    @classmethod
    def noise(cls) -> Haystack:
        return cls(None, "noise")

    @classmethod
    def from_file(cls, path: str | Path) -> Haystack:
        """The haystack of a local text file; one line of error for a missing, unreadable or empty file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SpectraError(f"cannot read the haystack {path}: {error}") from None
        words = tuple(word for word in re.sub(r"\s+", " ", text).split(" ") if word)
        if len(words) < 2:
            raise SpectraError(f"the haystack {path} holds no text (it needs words to hide the needles in)")
        return cls(words, str(path))

    def repeats(self, count: int) -> int:
        """How many times the file's words are laid end to end to give `count` words (1: not repeated)."""
        assert self.words is not None
        return max(1, -(-count // len(self.words)))

    def sentences(self, count: int) -> list[str]:
        """The first `count` words (the file repeated as often as needed, as RULER repeats the essays), cut into
        sentences."""
        assert self.words is not None
        text = " ".join((self.words * self.repeats(count))[:count]).strip()
        return [part for part in _SENTENCE_END.split(text) if part]


def depth_positions(units: int, depths: Sequence[float]) -> list[int]:
    """Insertion points (0…units) of needles at fractional depths: int(units × depth), as RULER places them."""
    return [min(units, int(units * depth)) for depth in depths]


def insert(units: Sequence[str], needles: Sequence[str], depths: Sequence[float], joiner: str) -> str:
    """`units` joined by `joiner` with each needle inserted before unit int(len(units) × depth) (needles at the
    same point keep their order)."""
    at = depth_positions(len(units), depths)
    order = sorted(range(len(needles)), key=lambda i: (at[i], i))
    pieces: list[str] = []
    start = 0
    for i in order:
        pieces += list(units[start: at[i]]) + [needles[i]]
        start = at[i]
    pieces += list(units[start:])
    return joiner.join(pieces)
