"""The package lists its pages in their order, each registered once under its name."""

from __future__ import annotations

import spectra.pages as pages


def test_the_pages_are_registered_in_order() -> None:
    assert list(pages.PAGES) == ["leaderboard", "questions", "survival", "task-scores"]
    assert all(page.name == name for name, page in pages.PAGES.items())
