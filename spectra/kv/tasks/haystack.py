"""What the synthetic tasks hide their needles in, and the words they draw: RULER's haystacks, made offline.

RULER has three haystacks: `noise` (one paragraph of filler sentences repeated, one per line), `essay` (Paul Graham's
essays, downloaded: here local text, `--haystack FILE`, cut into words as RULER cuts the essays and into sentences
where the needles go) and `needle` (the needles' own sentence with random keys and values: distractors).
Needles are inserted between units (lines or sentences) at a depth: a fraction of the units before them.

The essay stand-in is real prose by default: the licence texts Debian systems ship (`LICENCES`, the folder's plain
files in sorted order, symlinks and repeated contents skipped: ~37k words), or the files and folders a user names,
read in the order given. A file that is empty, binary (a NUL byte) or not UTF-8 is refused in one line; its
`sha256` (of the bytes read, in order: `cat FILES | sha256sum`) names the text in the records and run.json.

Word lists come from the `wonderwords` package, as in RULER: its noun, adjective and verb lists (one entry a line).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import SpectraError

#: RULER's noise haystack (and the landmark-attention passkey's garbage): one line of it per unit
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
#: the essay stand-in by default: the licence texts every Debian system ships (the README's corpus)
LICENCES = Path("/usr/share/common-licenses")
#: the name of RULER's noise haystack (in `--haystack noise` and the records' `haystack` field)
NOISE_NAME = "noise"
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
    """The essay stand-in: `words` of local text (white space collapsed, split on spaces, as RULER splits the
    essays), or None for RULER's noise haystack in its place. `name` says which (the files as given, or "noise"),
    `sha256` the bytes it was read from, for the records and run.json."""

    words: tuple[str, ...] | None
    name: str
    sha256: str = ""

    @classmethod
    def noise(cls) -> Haystack:
        return cls(None, NOISE_NAME, hashlib.sha256(NOISE.encode()).hexdigest())

    @classmethod
    def from_file(cls, path: str | Path) -> Haystack:
        """The haystack of one local text file (or folder: `from_files`)."""
        return cls.from_files([path])

    @classmethod
    def from_files(cls, paths: Sequence[str | Path]) -> Haystack:
        """The haystack of local text files, in the order given, a folder standing for its plain files in sorted
        order (`files_of`); a file whose bytes another one already gave is read once. Its name is the paths as
        given, comma-separated. One line of error for a missing, empty, binary or non-UTF-8 file."""
        digest, seen, words = hashlib.sha256(), set(), []
        for path in (found for given in paths for found in files_of(Path(given))):
            data = read_bytes(path)
            own = hashlib.sha256(data).hexdigest()
            if own not in seen:
                seen.add(own)
                words += text_words(data, path)
                digest.update(data)
        return cls(tuple(words), ",".join(str(path) for path in paths), digest.hexdigest())

    @classmethod
    def licences(cls) -> Haystack | None:
        """The default essay stand-in, the licence texts of `LICENCES`; None on a machine without them."""
        if not LICENCES.is_dir() or not any(path.is_file() for path in LICENCES.iterdir()):
            return None
        return cls.from_files([LICENCES])

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


def files_of(path: Path) -> list[Path]:
    """The files a haystack path stands for: a file itself; a folder its plain files in sorted order (symlinks, hidden
    files and subfolders skipped: Debian's GPL → GPL-3 would give the same text twice)."""
    if path.is_dir():
        found = sorted(item for item in path.iterdir()
                       if item.is_file() and not item.is_symlink() and not item.name.startswith("."))
        if not found:
            raise SpectraError(f"the haystack folder {path} holds no files: give text files or a folder of them")
        return found
    if not path.exists():
        raise SpectraError(f"the haystack {path} does not exist: give a local text file (or a folder of them)")
    return [path]


def read_bytes(path: Path) -> bytes:
    """The file's bytes; one line of error where it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise SpectraError(f"cannot read the haystack {path}: {error.strerror or error}") from None


def text_words(data: bytes, path: Path) -> list[str]:
    """The words of a text file's bytes (white space collapsed, split on spaces, as RULER splits the essays);
    refused in one line where the bytes are binary (a NUL byte), not UTF-8, or hold no word."""
    fix = "give a plain-text file (prose, UTF-8)"
    if b"\0" in data:
        raise SpectraError(f"the haystack {path} is binary (a NUL byte at offset {data.index(0)}), not text: {fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpectraError(f"the haystack {path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                           f"{error.start}): {fix}") from None
    words = [word for word in re.sub(r"\s+", " ", text).split(" ") if word]
    if not words:
        raise SpectraError(f"the haystack {path} holds no text (it needs words to hide the needles in): {fix}")
    return words


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
