"""The report pages: one module each (leaderboard, questions, survival, task-scores), registered as they load.

A page reads finished task runs and gives its values and claims, its picture and its table (`base.Page`); one
command writes them (`spectra <page> RUN… --out DIR`, `written.write`), one function each in `spectra.api`, and the
README's paragraphs read the same pages. Adding a page is its module here (a `Page` subclass, registered), its
paragraph in a template under templates/ and its test. See ARCHITECTURE.md.
"""

from .base import PAGE, PAGES, Page, Sheet, register

__all__ = ["PAGE", "PAGES", "Page", "Sheet", "register"]
