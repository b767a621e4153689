"""Writing a report page: `spectra <page> RUN… --out DIR` puts the page's markdown, picture and table into DIR.

Everything that can be refused is refused before the work, each in one line and with nothing written: DIR that is a
file or cannot be written, no runs, a folder that is not a run, a run of another command than the page reads (read
from run.json alone), then, once loaded, a run that is not a task run or runs that do not pool (`Page.prepare`). Then
the values, picture and table are made and written whole or not at all: into a hidden folder beside DIR's files,
renamed into DIR one by one once every file is written (DIR/<page>.md, DIR/<page>.png, DIR/<page>.csv replace
those of an earlier write; nothing else in DIR is touched).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpectraError
from .base import Page

#: the picture's resolution
DPI = 100


@dataclass(frozen=True)
class Written:
    """The files a page was written to: its markdown, its picture and its table."""

    markdown: Path
    picture: Path
    table: Path

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        return self.markdown, self.picture, self.table


def check_runs(page: Page, paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The run directories, each a finished run of a command the page reads (from its run.json, nothing loaded)."""
    from ..kinds import read_meta

    found = [Path(path) for path in paths]
    page.check_count(found)
    for path in found:
        kind = read_meta(path).get("kind")
        if kind not in page.kinds:
            raise SpectraError(f"{path} is a run of spectra {kind}; spectra {page.name} reads task runs of spectra "
                               f"{' or '.join(page.kinds)}")
    return found


def check_out(out: Path) -> None:
    """DIR is a folder (or none yet) under a folder this user can write."""
    from ..rundir import check_writable

    if out.exists() and not out.is_dir():
        raise SpectraError(f"--out {out} is a file; give the folder the page is written into")
    check_writable(out, inside=True)


def write(page: Page, runs: Sequence[str | os.PathLike], out: str | os.PathLike, **options: Any) -> Written:
    """Write `page` of the finished runs at `runs` into the folder `out` (made if missing): <name>.md, <name>.png
    and <name>.csv; `options` are the page's (`Page.options`). Bad input is one line (SpectraError), nothing
    written."""
    from ..kinds import load_run

    out = Path(out)
    try:
        settings = page.options(**options)
    except TypeError as error:
        raise SpectraError(f"spectra {page.name}: {error}") from None
    check_out(out)
    prepared = page.prepare([load_run(path) for path in check_runs(page, runs)], settings)
    written = Written(out / f"{page.name}.md", out / f"{page.name}.png", out / f"{page.name}.csv")
    sheet = page.sheet(prepared)
    figure = page.draw(prepared)
    table = page.table(prepared)
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=out, prefix=f".{page.name}-"))
    try:
        staged = Written(*(folder / path.name for path in written.paths))
        staged.markdown.write_text(page.markdown(sheet, written.picture.name, written.table.name))
        figure.savefig(staged.picture, dpi=DPI, bbox_inches="tight", format="png")
        table.to_csv(staged.table, index=False)
        for source, target in zip(staged.paths, written.paths):
            os.replace(source, target)
    except OSError as error:
        raise SpectraError(f"--out {out}: cannot write the page ({error.strerror or error})") from None
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)
        shutil.rmtree(folder, ignore_errors=True)
    return written
