"""Haystacks: needles inserted at int(units × depth), text files cut into words and sentences (several files, a
folder, the licence texts by default; bad files refused in one line), their sha256, the word lists."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from spectra.errors import SpectraError
from spectra.kv.tasks import haystack as haystack_module
from spectra.kv.tasks.haystack import NOISE, Haystack, common_words, depth_positions, insert, niah_words, word_list


def test_needles_go_before_unit_int_units_times_depth() -> None:
    units = [f"u{i}" for i in range(10)]
    assert insert(units, ["A", "B"], [0.55, 0.0], ",") == "B,u0,u1,u2,u3,u4,A,u5,u6,u7,u8,u9"
    assert insert(units, ["A", "B"], [1.0, 1.0], ",").endswith("u9,A,B")
    assert depth_positions(7, [0.0, 0.5, 0.99, 1.0]) == [0, 3, 6, 7]


def test_a_text_file_is_cut_into_words_then_sentences(tmp_path: Path) -> None:
    path = tmp_path / "h.txt"
    path.write_text("First one.  Second\n\tone!\n\n\"Third?\" Fourth")
    haystack = Haystack.from_file(path)
    assert haystack.words == ("First", "one.", "Second", "one!", "\"Third?\"", "Fourth")
    assert haystack.sentences(6) == ["First one.", "Second one!", "\"Third?\"", "Fourth"]
    assert haystack.sentences(3) == ["First one.", "Second"]
    assert haystack.sentences(8) == ["First one.", "Second one!", "\"Third?\"", "Fourth First one."]
    assert [haystack.repeats(count) for count in (0, 3, 6, 7, 12, 13)] == [1, 1, 1, 2, 2, 3]


@pytest.mark.parametrize("content, message", [
    (b"", "holds no text"),
    (b" \n\t ", "holds no text"),
    (b"Some prose.\x00\x01\x02 then more", "is binary (a NUL byte at offset 11), not text"),
    ("Café au lait.".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 3)"),
])
def test_bad_haystack_files_are_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    """Empty, blank, binary and non-UTF-8 files: one line naming the file, what is wrong and what to give (a binary
    file decoded as UTF-8 was taken as text before: its NUL bytes became words around the needles)."""
    path = tmp_path / "h.txt"
    path.write_bytes(content)
    with pytest.raises(SpectraError) as refused:
        Haystack.from_file(path)
    text = str(refused.value)
    assert f"the haystack {path} {message}" in text and "\n" not in text, text
    assert text.endswith("give a plain-text file (prose, UTF-8)")
    with pytest.raises(SpectraError, match="does not exist"):
        Haystack.from_file(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpectraError, match="folder .*empty holds no files"):
        Haystack.from_file(tmp_path / "empty")


def test_several_files_are_read_in_order_and_hashed_as_their_bytes(tmp_path: Path) -> None:
    """Files are laid end to end in the order given (never a word merged across two files), a file repeated is read
    once, and the sha256 is that of the bytes read (`cat A B | sha256sum`)."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("Alpha beta.")  # no final newline: "beta." and "Gamma" stay two words
    second.write_text("Gamma delta!\n")
    stack = Haystack.from_files([first, second, first])
    assert stack.words == ("Alpha", "beta.", "Gamma", "delta!")
    assert stack.name == f"{first},{second},{first}"
    assert stack.sha256 == hashlib.sha256(b"Alpha beta.Gamma delta!\n").hexdigest()
    assert Haystack.from_files([second, first]).words == ("Gamma", "delta!", "Alpha", "beta.")


def test_a_folder_is_its_plain_files_in_sorted_order(tmp_path: Path) -> None:
    """Symlinks (Debian's GPL → GPL-3), hidden files, subfolders and repeated contents are skipped, so the folder
    gives each text once, in an order that does not depend on the file system's."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for name, text in (("b", "Second file."), ("a", "First file."), ("c", "First file."), (".hidden", "Hidden.")):
        (folder / name).write_text(text)
    (folder / "d").symlink_to(folder / "b")
    (folder / "sub").mkdir()
    (folder / "sub" / "e").write_text("Below.")
    stack = Haystack.from_file(folder)
    assert stack.words == ("First", "file.", "Second", "file.") and stack.name == str(folder)
    assert stack.sha256 == hashlib.sha256(b"First file.Second file.").hexdigest()


def test_the_default_is_the_licence_texts(tmp_path: Path, monkeypatch) -> None:
    """The licence texts Debian ships: the folder's plain files in sorted order, symlinks skipped — the text and
    sha256 a shell gives; None where the folder is absent (the command then refuses in one line)."""
    folder = Path("/usr/share/common-licenses")
    if not folder.is_dir():
        pytest.skip("no /usr/share/common-licenses on this machine")
    files = sorted(path for path in folder.iterdir() if path.is_file() and not path.is_symlink())
    data = b"".join(dict.fromkeys(path.read_bytes() for path in files))
    stack = Haystack.licences()
    assert stack is not None and stack.name == str(folder) and stack.words == tuple(data.decode().split())
    assert stack.sha256 == hashlib.sha256(data).hexdigest() and len(stack.words) > 20000
    monkeypatch.setattr(haystack_module, "LICENCES", tmp_path / "absent")
    assert Haystack.licences() is None


def test_the_noise_haystack_is_named_and_hashed() -> None:
    noise = Haystack.noise()
    assert noise.words is None and noise.name == "noise"
    assert noise.sha256 == hashlib.sha256(NOISE.encode()).hexdigest()


def test_the_word_lists_are_wonderwords() -> None:
    adjectives, nouns = niah_words()
    assert len(adjectives) > 500 and len(nouns) > 5000 and list(nouns) == sorted(nouns)
    assert len(set(word_list("noun"))) == len(word_list("noun"))
    assert set(common_words()) == set(word_list("noun")) | set(adjectives) | set(word_list("verb"))
