"""A finished task or analyze run's published form: a small folder to commit, from which its tables read back without
the run.

A run directory of `spectra evaluate` is not committed (its arrays, checkpoints and figures are large and local), so a
page quoting it could not be re-derived without rerunning it. `spectra publish RUN… --out DIR` writes, per run,
`DIR/<run name>/`: the run's tables (`TABLES`: the per-example answers, scores, kept shares, bytes and needle shares,
the per-task summaries, the per-layer × head needle table, the failures' evicted layers) each gzipped reproducibly —
the run's own CSV bytes, whose columns and float formatting its writer fixes, compressed with no name and modification
time 0, so the same run gives the same bytes — and its run.json (the task file's, haystacks', model's and artifacts'
sha256, the versions) with `published`: each file's sha256 and size, and the uncompressed table's sha256 (the run's
own file's). `load` (the task run's read side, `report.evaluate.load`) reads such a folder as the run itself, every
file checked against its recorded sha256 first: a missing or changed file is one line naming it, the hashes expected
and found, and how to publish it again. The leaderboard's pooling compares the full cache's answers as strings,
which task_examples.csv holds (`prediction`): answers.npz's token ids are not needed, and not published. needle.npz
(per question, layer and key/value head, the share of the needle kept: what `report.bridge` correlates with a head's
spectrum) is published where the run wrote it, gzipped alike (`TaskRun.arrays` reads it back).

An `analyze` run publishes its per-head tables (metrics.csv, and qkv.csv where it measured the keys): what the bridge
and a headbudget's weights read. Its curves (curves.npz, megabytes of float64 per index) stay in the run directory,
so its published folder reads back as `report.analyze.Tables`, not as the run: a command that draws the curves
refuses it in one line (`kinds.base.load_run`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import SpectraError
from ..rundir import check_writable, write_meta

#: run.json's key holding the published files
PUBLISHED = "published"
#: the tables a published task run holds, and those it holds where the run wrote them (task_questions.csv where its
#: records ask several questions; needle.npz, the per-question needle shares)
TABLES = ("task_examples.csv", "task_scores.csv", "task_lengths.csv", "task_needle.csv", "task_evicted.csv")
OPTIONAL = ("task_questions.csv", "needle.npz")
#: per kind of run it publishes: the files it must hold, and those it holds where the run wrote them
FILES = {"evaluate": (TABLES, OPTIONAL), "analyze": (("metrics.csv",), ("qkv.csv",))}
#: the per-example columns the leaderboard and the survival tables read (`probes.tasks.EXAMPLE_COLUMNS`)
EXAMPLE_COLUMNS = ("press", "ratio", "example", "question", "task", "length", "depth", "prediction", "score", "kept",
                   "bytes", "bytes_share", "needle_kept")
#: the key of a published file's record holding the sha256 of the run's own file (uncompressed): a table's, an array's
PLAIN = {True: "csv_sha256", False: "npz_sha256"}
#: how a published table is named: the run's table, gzipped
SUFFIX = ".gz"
#: the hex digits of a sha256 a message shows
SHOWN = 12


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def compressed(data: bytes) -> bytes:
    """`data` gzipped reproducibly: no file name, modification time 0, the highest level."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def readable(path: Path) -> dict[str, Any]:
    """A finished run's run.json, the run refused in one line unless it is a finished `spectra evaluate` run holding
    every table of `TABLES` with the per-example columns a leaderboard reads (`EXAMPLE_COLUMNS`), or a finished
    `spectra analyze` run holding its metrics.csv."""
    try:
        meta = json.loads((path / "run.json").read_text())
    except (OSError, ValueError):
        raise SpectraError(f"{path} is not a finished spectra run: its run.json is missing or unreadable") from None
    if PUBLISHED in meta:
        raise SpectraError(f"{path} is a published run already: publish from its run directory")
    if meta.get("status") == "running":
        raise SpectraError(f"{path} is a run still running or interrupted: finish it (--resume), then publish it")
    if meta.get("kind") not in FILES:
        raise SpectraError(f"{path} holds a run of 'spectra {meta.get('kind')}': only task runs (spectra evaluate) "
                           "and analyze runs are published")
    for name in FILES[meta["kind"]][0]:
        if not (path / name).is_file():
            raise SpectraError(f"{path / name} is missing: the run directory is incomplete (finish it with --resume)")
    if meta["kind"] != "evaluate":
        return meta
    with open(path / TABLES[0], encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
    if tuple(header) != EXAMPLE_COLUMNS:
        missing = [column for column in EXAMPLE_COLUMNS if column not in header]
        raise SpectraError(f"{path / TABLES[0]} has the columns {', '.join(header)}, not the ones a published run "
                           f"holds ({', '.join(EXAMPLE_COLUMNS)}{'; it lacks ' + ', '.join(missing) if missing else ''})"
                           ": rerun it with this version of spectra")
    return meta


def publish(runs: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Write each finished task run of `runs` as `out/<its name>/` (see the module docstring), replacing a folder of
    that name (publishing again is how a changed or damaged one is mended; the folders are under version control);
    every run is checked before anything is written (one line each), and each folder is written whole or not at all.
    Returns the folders written."""
    out = Path(out)
    check_writable(out, "--out", inside=True)
    checked = []
    for run in map(Path, runs):
        meta = readable(run)
        target = out / run.resolve().name
        if any(target == other for _, _, other in checked):
            raise SpectraError(f"two runs are named {run.resolve().name}: each is published under its name in {out}")
        checked.append((run, meta, target))
    written = []
    for run, meta, target in checked:
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        files = {}
        required, optional = FILES[meta["kind"]]
        for name in (*required, *(name for name in optional if (run / name).is_file())):
            data = (run / name).read_bytes()
            packed = compressed(data)
            (partial / (name + SUFFIX)).write_bytes(packed)
            files[name + SUFFIX] = {"sha256": sha256(packed), "bytes": len(packed), PLAIN[name.endswith(".csv")]:
                                    sha256(data)}
        write_meta(partial, {**meta, PUBLISHED: {"run": run.resolve().name, "files": files}})
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
        written.append(target)
    return written


def verified(path: Path, meta: dict[str, Any]) -> str:
    """The suffix of a run's tables: "" for a run directory, `SUFFIX` for a published folder, whose every recorded
    file is checked against its sha256 first (SpectraError, one line, where one is missing or changed)."""
    if PUBLISHED not in meta:
        return ""
    files = meta[PUBLISHED].get("files") if isinstance(meta[PUBLISHED], dict) else None
    required = FILES.get(str(meta.get("kind")), (TABLES,))[0]
    if not isinstance(files, dict) or not all(name + SUFFIX in files for name in required):
        raise SpectraError(f"{path}/run.json does not list the published tables ({', '.join(required)}): publish the "
                           f"run again ({republish(path)})")
    for name, recorded in files.items():
        expected = str(recorded.get("sha256", "")) if isinstance(recorded, dict) else ""
        file = path / name
        if not file.is_file():
            raise SpectraError(f"{file} is missing (its run.json records sha256 {expected[:SHOWN]}…): publish the run "
                               f"again ({republish(path)})")
        found = sha256(file.read_bytes())
        if found != expected:
            raise SpectraError(f"{file} has sha256 {found[:SHOWN]}… where its run.json records {expected[:SHOWN]}…: it "
                               f"changed since it was published; publish the run again ({republish(path)})")
    return SUFFIX


def arrays(path: Path, meta: dict[str, Any], name: str) -> dict[str, Any]:
    """The arrays of the run's .npz file `name`: from its run directory, or gunzipped from its published folder
    (whose sha256 `verified` checked when the run loaded); one line where the run has none."""
    import io

    import numpy as np

    from ..runs import read_arrays

    if PUBLISHED not in meta:
        if not (path / name).exists():
            raise SpectraError(f"{path} has no {name} (a run before it was written): rerun it with this spectra")
        return read_arrays(path / name)
    file = path / (name + SUFFIX)
    if not file.is_file():
        raise SpectraError(f"{path} holds no {name}: it was published without it; publish it again from its run "
                           f"directory ({republish(path)})")
    with np.load(io.BytesIO(gzip.decompress(file.read_bytes())), allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def republish(path: Path) -> str:
    """The command that publishes the run behind the published folder `path` again."""
    return f"spectra publish RUN --out {path.parent}, RUN its run directory"
