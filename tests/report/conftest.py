"""Fixtures of the report tests: real tiny runs of each kind, built once per session and shared by the
summaries, plan, console and plot tests (tests/report/ goes on sys.path for `import report_helpers`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import report_helpers


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """The printers' numbers are checked on a terminal wide enough for every table and title to stay whole (folding
    to a narrow terminal has its own tests)."""
    from spectra.report import console

    monkeypatch.setattr(console.out, "width", 400)  # the one console every kind's printer writes to


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict:
    """The analyze runs of `report_helpers.build_runs`, by key (small-wiki, deep-imdb, small-imdb-n16, …)."""
    return report_helpers.build_runs(tmp_path_factory.getbasetemp() / "spectra-tiny-runs")


@pytest.fixture(scope="session")
def approx_run(roberta_dir, text_file, tmp_path_factory):
    """An approx run with --end-to-end in a directory named tiny-approx."""
    return report_helpers.build_approx(roberta_dir, text_file, tmp_path_factory.mktemp("approx") / "tiny-approx")


@pytest.fixture(scope="session")
def theorem_runs(tmp_path_factory) -> Path:
    """The --runs-dir of analyses/theorems.py, holding `theorem_run`."""
    return tmp_path_factory.mktemp("theorem-runs")


@pytest.fixture(scope="session")
def theorem_run(roberta_dir, text_file, theorem_runs):
    """Named as analyses/theorems.py names it, so the recipe finds it finished."""
    out = report_helpers.theorem_run_dir(theorem_runs, roberta_dir, text_file)
    return report_helpers.build_theorems(roberta_dir, text_file, out)


@pytest.fixture(scope="session")
def scaling_run(roberta_dir, text_file, tmp_path_factory):
    """A scaling run over n = 16, 40, 64 with bootstrap intervals."""
    import spectra

    return spectra.scaling(str(roberta_dir), str(text_file), lengths=[16, 40, 64], samples=4, batch_size=2,
                           bootstrap=20, out=tmp_path_factory.mktemp("scaling") / "tiny-scaling", progress=None,
                           notify=lambda line: None)


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    """Figures drawn by a test are closed after it, so a long run never holds dozens of open figures."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
