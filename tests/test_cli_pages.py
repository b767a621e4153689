"""Each page's command takes RUN…, --out and the page's own options, spelled as its option dataclass declares them."""

from __future__ import annotations

from spectra.cli_pages import parameters
from spectra.pages import PAGES


def test_a_page_command_takes_runs_out_and_its_options() -> None:
    assert [parameter.name for parameter in parameters(PAGES["survival"])] == ["runs", "out", "ratio"]
    assert [parameter.name for parameter in parameters(PAGES["task-scores"])] == ["runs", "out"]
    assert [parameter.name for parameter in parameters(PAGES["leaderboard"])] == ["runs", "out", "equality"]
    assert parameters(PAGES["survival"])[2].default is None  # default: the page's own ratio, 0.5
