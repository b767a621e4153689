"""`python -m spectra …` (and `torchrun … -m spectra …`) runs the command line.

`python -m` puts the current directory first on sys.path, so a folder named spectra there (a clone of this
repository, run from its parent) can hide the installed package: it is refused at once, in one line saying why.
"""

from __future__ import annotations

import sys
from pathlib import Path


def shadowing(package: object) -> str | None:
    """What hides the installed spectra when `package` (the module Python imported as `spectra`) is not it, else
    None.

    A folder named spectra without an __init__.py (a clone of this repository is one) in a directory that comes
    first on sys.path is imported as an empty namespace package: Python takes it before an editable install's
    finder, so `spectra` has no `__file__` and its `__path__` names that folder, while this module (found by the
    finder) still comes from the installed package. `spectra.__init__` never ran: the package is half there.
    """
    if package is None or getattr(package, "__file__", None) is not None:
        return None
    here = Path(__file__).resolve().parent
    folders = [folder for folder in getattr(package, "__path__", []) if Path(folder).resolve() != here]
    folder = folders[0] if folders else "a folder named spectra"
    return (f"the folder {folder} hides the installed spectra package (python -m looks in the current directory "
            "first): run from another directory, or use the spectra command, which is not affected")


if __name__ == "__main__":
    hidden = shadowing(sys.modules.get(__package__ or "spectra"))
    if hidden is not None:
        print(f"error: {hidden}", file=sys.stderr)
        sys.exit(2)
    from .cli import main

    main()
