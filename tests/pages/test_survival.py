"""The survival page at another ratio than half the cache, recounted from the runs, and the ratios it refuses."""

from __future__ import annotations

import pytest

from spectra.errors import SpectraError
from spectra.pages import PAGES
from spectra.report import leaderboard


def test_the_page_reads_the_ratio_asked(board_runs) -> None:
    page = PAGES["survival"]
    prepared = page.prepare(board_runs, page.options(ratio=0.75))
    table = page.table(prepared)
    examples = leaderboard.pooled(board_runs)
    held = examples[examples["task"].isin(leaderboard.held(examples)[0])]
    answered = held[(held["press"] == "full") & (held["score"] >= 1)]["example"]
    assert set(table["ratio"]) == {0.75} and set(table["press"]) <= {"streaming", "knorm"}
    for row in table.itertuples():
        mine = held[(held["press"] == row.press) & (held["ratio"] == 0.75) & held["example"].isin(answered)]
        assert (row.answered, row.kept) == (len(mine), int((mine["score"] >= 1).sum()))
    assert page.sheet(prepared).values["survival_ratio"] == "0.75"


@pytest.mark.parametrize("ratio, message", [(1.5, "between 0 and 1"), (0.6, "the runs measured the ratios 0.5, 0.75")])
def test_a_ratio_the_runs_did_not_measure_is_one_line(board_runs, ratio, message) -> None:
    with pytest.raises(SpectraError, match=message):
        PAGES["survival"].render(board_runs, ratio=ratio)
