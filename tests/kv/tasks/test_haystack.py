"""Haystacks: needles inserted at int(units × depth), a text file cut into words and sentences, the word lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectra.errors import SpectraError
from spectra.kv.tasks.haystack import Haystack, common_words, depth_positions, insert, niah_words, word_list


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


def test_bad_haystack_files(tmp_path: Path) -> None:
    with pytest.raises(SpectraError, match="cannot read the haystack"):
        Haystack.from_file(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text(" \n ")
    with pytest.raises(SpectraError, match="holds no text"):
        Haystack.from_file(tmp_path / "empty.txt")


def test_the_word_lists_are_wonderwords() -> None:
    adjectives, nouns = niah_words()
    assert len(adjectives) > 500 and len(nouns) > 5000 and list(nouns) == sorted(nouns)
    assert len(set(word_list("noun"))) == len(word_list("noun"))
    assert set(common_words()) == set(word_list("noun")) | set(adjectives) | set(word_list("verb"))
