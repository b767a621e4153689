"""The one reporter: progress only when asked, warnings marked, a quiet copy for the other processes."""

from __future__ import annotations

from spectra.reporter import QUIET, Reporter


def test_progress_notices_and_warnings_reach_the_front_end() -> None:
    seen, lines = [], []
    reporter = Reporter(lambda done, total: seen.append((done, total)), lines.append)
    reporter.advance(3, 8)
    reporter.notify("loaded")
    reporter.warn("fell back to the CPU")
    assert seen == [(3, 8)] and lines == ["loaded", "warning: fell back to the CPU"]
    quiet = reporter.quiet()
    quiet.advance(4, 8)
    quiet.warn("not shown")
    assert seen == [(3, 8)] and len(lines) == 2, "the quiet copy says nothing"
    Reporter(None, lines.append).advance(1, 2)  # no progress: nothing to call
    QUIET.warn("nothing")
    assert len(lines) == 2
