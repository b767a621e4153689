"""A report page is its module: a page registered (here inside a test, `Registry.extended`) gets its command, listed
by `spectra --help` with its options, its function in `spectra.api` and the README's renderer of its paragraph, and
writes its markdown, picture and table, with nothing else to edit."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import typer
from typer.testing import CliRunner

from spectra import api
from spectra.cli_options import FlaglessGroup
from spectra.cli_pages import add_pages
from spectra.options import option
from spectra.pages import PAGE, PAGES, Page, Sheet

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CountOptions:
    at: float = option(0.5, "The ratio counted.")


class CountPage(Page):
    """How many rows each press has at one ratio: small enough to recount here."""

    name = "row-count"
    summary = "How many rows each press has at a ratio."
    options = CountOptions
    pools = False
    paragraphs = {"row-count-paragraph": PAGE}
    text = "At r = {at}: {rows} rows."

    def prepare(self, runs, options):
        self.check_count(runs)
        return runs[0], options.at

    def sheet(self, prepared, view=PAGE):
        run, at = prepared
        rows = run.examples[run.examples["ratio"] == at]
        return Sheet({"at": f"{at:g}", "rows": str(len(rows))}, {"some-rows": bool(len(rows))})

    def draw(self, prepared):
        import matplotlib.pyplot as plt

        figure, ax = plt.subplots()
        ax.bar(["rows"], [len(prepared[0].examples)])
        return figure

    def table(self, prepared):
        run, at = prepared
        return run.examples[run.examples["ratio"] == at].groupby("press").size().rename("rows").reset_index()


def test_a_registered_page_has_its_command_help_function_and_renderer(board_runs, tmp_path) -> None:
    page = CountPage()
    assert page.name not in PAGES
    with PAGES.extended({page.name: (page, {"order": 99})}):
        app = typer.Typer(cls=FlaglessGroup, rich_markup_mode=None, add_completion=False)
        app.command("noop")(lambda: None)  # a group of one command would run it without its name
        add_pages(app, PAGES)
        runner = CliRunner()
        listed = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
        assert "row-count" in listed.output and page.summary in listed.output and "leaderboard" in listed.output
        own = runner.invoke(app, ["row-count", "--help"], env={"COLUMNS": "200"})
        assert "--at" in own.output and "The ratio counted." in own.output and "--out" in own.output
        run = board_runs[0]
        done = runner.invoke(app, ["row-count", str(run.path), "--out", str(tmp_path / "cli"), "--at", "0.75"])
        assert done.exit_code == 0, done.output
        expected = int((run.examples["ratio"] == 0.75).sum())
        assert (tmp_path / "cli" / "row-count.md").read_text().splitlines()[2] == f"At r = 0.75: {expected} rows."
        written = api.row_count(run.path, out=tmp_path / "api")  # the function: the name with underscores
        assert [path.name for path in written.paths] == ["row-count.md", "row-count.png", "row-count.csv"]
        assert written.picture.read_bytes().startswith(b"\x89PNG")
        assert "At r = 0.5: " in written.markdown.read_text()
        sys.path.insert(0, str(ROOT / "analyses"))
        import readme_numbers

        renderer = readme_numbers.page_renderers()["row-count-paragraph"]
        assert renderer.needs == ("evaluate",)
        assert renderer.read({"evaluate": [run]}).values["rows"] == str(int((run.examples["ratio"] == 0.5).sum()))
    assert page.name not in PAGES and "row_count" not in api.pages()


def test_every_page_is_listed_by_spectra_help_and_is_a_function(monkeypatch, capsys) -> None:
    import spectra
    from tiny import run_cli

    code, out, _ = run_cli(["--help"], monkeypatch, capsys)
    for name, page in PAGES.items():
        assert name in out and callable(getattr(spectra, page.function)), name
    assert list(PAGES) == ["leaderboard", "questions", "survival", "task-scores"]
    code, out, _ = run_cli(["tasks", "--help"], monkeypatch, capsys)  # the page task-scores leaves `tasks` its own
    assert code == 0 and "Long-context task files generated offline" in out
