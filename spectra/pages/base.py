"""What a report page is: a registered view of finished task runs — its values, claims, picture and table in one
module — written by one command.

A `Page` subclass declares

- `name` (the command `spectra <name>` and the function `spectra.<name>`, dashes as underscores), `summary` (one
  line for --help), `order` (its place in listings) and `options` (a frozen dataclass of `spectra.options.option`
  fields: the command's flags and the function's keywords, as an analysis declares its own);
- `kinds` (the `spectra` commands whose runs it reads) and `pools` (several runs pooled, or exactly one);
- `prepare(runs, options)`: the runs checked and pooled, cheap, before any bootstrap or drawing: bad input is one
  line (`SpectraError`) here;
- `sheet(prepared, view)`: its values (markdown: numbers, lists, tables) and claims (the interpretations the prose
  around them makes, each True or False on these runs); `view` names one of the paragraphs it renders in the
  README and docs (`paragraphs`: marker → view), "page" its own;
- `draw(prepared)`: its picture; `table(prepared)`: its numbers as one tidy table (the CSV);
- `text`: its own page's markdown around the values (`{name}` stands for a value).

`register` adds an instance to `PAGES`, which imports every module of this package on first listing: a page is its
module here, and nothing else names it — the command line (`spectra.cli_pages`), the Python API (`spectra.api`)
and the README's renderers (analyses/readme_numbers.py) are built from the registry. Nothing here imports pandas,
matplotlib or torch: a page imports what it computes with inside its methods, so `spectra --help` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import SpectraError
from ..registry import Registry

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: page name → page, in `order` (each module of spectra/pages/ registers its own on import)
PAGES: Registry[Page] = Registry("page", "spectra.pages", imported=True, order="order")
#: the view of a page that is its own page (`spectra <name>`), beside the README paragraphs it renders
PAGE = "page"


@dataclass(frozen=True)
class Sheet:
    """A page's values (name → markdown text) and claims (name → whether it holds on the runs)."""

    values: dict[str, str]
    claims: dict[str, bool]


@dataclass(frozen=True)
class NoOptions:
    """The options of a page that takes none."""


class Page:
    """A registered report page (see the module docstring); subclasses declare what they need."""

    name: ClassVar[str]
    summary: ClassVar[str]
    order: ClassVar[int] = 100
    options: ClassVar[type] = NoOptions
    #: the spectra commands whose task runs the page reads (the README's paragraphs read the runs of these)
    kinds: ClassVar[tuple[str, ...]] = ("evaluate",)
    #: the spectra commands of a README code block whose runs the page's paragraphs read (`spectra cache` on a task
    #: file writes a run of the kind evaluate)
    commands: ClassVar[tuple[str, ...]] = ("evaluate",)
    #: whether the page pools several runs (`report.leaderboard.pooled`) or reads exactly one
    pools: ClassVar[bool] = True
    #: README marker (`<!-- numbers: NAME -->`) → the view of `sheet` that fills it
    paragraphs: ClassVar[dict[str, str]] = {}
    #: the page's own markdown, `{value}` for each value it quotes
    text: ClassVar[str] = ""
    #: what RUNS are, for --help
    runs_help: ClassVar[str] = "Run directories of spectra evaluate on one task file (or their published folders)."

    @property
    def function(self) -> str:
        """The name of the page's Python function (`spectra.<function>`)."""
        return self.name.replace("-", "_")

    def check_count(self, runs: list[Any]) -> None:
        """One run or more for a pooling page, exactly one for any other (one line otherwise)."""
        if not runs:
            raise SpectraError(f"spectra {self.name} reads {'one or more task runs' if self.pools else 'one task run'}"
                               f" of spectra {' or '.join(self.kinds)}: give {'their' if self.pools else 'its'} run "
                               "director" + ("ies" if self.pools else "y"))
        if not self.pools and len(runs) != 1:
            raise SpectraError(f"spectra {self.name} reads one task run, got {len(runs)}: give one run directory")

    def prepare(self, runs: list[Any], options: Any) -> Any:
        """The runs checked (and pooled) for `sheet`, `draw` and `table`: cheap, before any of them; bad input is one
        line (SpectraError)."""
        raise NotImplementedError

    def sheet(self, prepared: Any, view: str = PAGE) -> Sheet:
        raise NotImplementedError

    def draw(self, prepared: Any) -> Figure:
        raise NotImplementedError

    def table(self, prepared: Any) -> pd.DataFrame:
        raise NotImplementedError

    def render(self, runs: list[Any], view: str = PAGE, **options: Any) -> Sheet:
        """`sheet` of the runs (loaded), with the page's `options` as keywords."""
        return self.sheet(self.prepare(runs, self.options(**options)), view)

    def markdown(self, sheet: Sheet, picture: str, table: str) -> str:
        """The page's own markdown: its summary as the title, `text` with the values in place, the claims each said
        to hold or not, the picture and the CSV named."""
        claims = "\n".join(f"- `{claim}`: {'holds' if holds else 'does not hold'}"
                           for claim, holds in sheet.claims.items())
        return (f"# {self.summary}\n\n{self.text.format_map(sheet.values).strip()}\n\n"
                + (f"## Claims on these runs\n\n{claims}\n\n" if claims else "")
                + f"![{self.summary}]({picture})\n\nThe numbers: [{table}]({table})\n")


def register(page: Page) -> Page:
    """Add `page` to `PAGES` under its name (once)."""
    return PAGES.add(page.name, page, order=page.order)
