"""What a run's presses read beyond the model, by sha256: each artifact press's files and the data they were fitted on.

A press written `name(PATH)` — `kvzap(DIR)`, `qfilter(DIR)`, `expected_attention_stats(DIR)` (`spectra artifacts`
writes them), `duo(DIR)` and `headbudget(DIR)` (a `spectra heads` run), `mixed(DIR)` (a `spectra cache` run),
`lukv(FILE)` (a budget curve) — scores with something fitted elsewhere, so a number it gives is auditable only with
those bytes named. run.json's `artifacts` records, per such press, the sha256 of each file it may read (a directory's
files, a file itself) and the data it was fitted on, as the folder's own run.json records it (`spectra artifacts` and
every run write one; None where there is none: a curve from the LU-KV repository). Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import gguffile, registry
from ..inputs import split_top
from ..registry import PRESSES


def files(path: Path) -> dict[str, str]:
    """File name → sha256 of what a press argument names: a file, or the files directly inside a directory."""
    if path.is_file():
        return {path.name: gguffile.sha256(path)}
    return {file.name: gguffile.sha256(file) for file in sorted(path.iterdir()) if file.is_file()}


def fitted_on(path: Path) -> Any:
    """The data an artifact was fitted on: the `data` its folder's run.json records (None without one)."""
    meta = (path if path.is_dir() else path.parent) / "run.json"
    try:
        return json.loads(meta.read_text()).get("data")
    except (OSError, ValueError, AttributeError):
        return None


def artifacts(presses: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    """Per press of `presses` that reads a path (its declared `argument`: an artifact, a pattern, a run, a curve), also
    inside a wrapper (`adakv(…)`, `composed(…,…)`): the press as named, the resolved path, each file's sha256 and the
    data it was fitted on (`fitted_on`)."""
    found = []
    for press in presses:
        parts = registry.applied(press)
        entry = None if parts is None else PRESSES.entries().get(parts[0])
        if entry is None:
            continue
        if not entry.facts.get("argument"):  # a wrapper: what it wraps may read a path
            found += artifacts(split_top(parts[1]))
            continue
        path = Path(parts[1])
        if path.exists():  # a missing one is refused before the run, by the press's own check
            found.append({"press": press, "path": str(path.resolve()), "sha256": files(path),
                          "data": fitted_on(path)})
    return found
