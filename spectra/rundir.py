"""Writing a run directory: checked before anything touches the disk, locked while a run writes it, atomic.

A run is built in `<out>.partial/` (checkpoints land there too: one process's `checkpoint.npz`, the shards of
several processes under `shards/`, see `spectra.shards`) and renamed to `<out>` only when complete,
so an interrupted or failed run never looks finished and an existing run is replaced only after its
successor is whole. From its set-up to its last file, before its model loads, a run holds an exclusive lock
(`.<out>.lock` beside the directory, naming its process) and checks its target again under it, so a second run
aimed at the same place stops at once instead of racing it, and a run that finished in between is seen. Files
are written through a temporary file and a rename, with the permissions the user's umask gives. Nothing
is pickled: JSON, CSV and `.npz`. Reading runs back is each analysis's read side (`spectra.report.<kind>`, on `spectra.runs`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import SpectraError, spell

if TYPE_CHECKING:
    import pandas as pd

try:  # POSIX; elsewhere the lock falls back to creating the lock file exclusively
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

CHECKPOINT = "checkpoint.npz"
#: the folder of a partial run where each process of a run checkpoints its own sequences (`spectra.shards`)
SHARDS = "shards"
#: the two options that decide what happens to an existing run directory, as each front end spells them
OVERWRITE, RESUME = spell("--overwrite", "overwrite=True"), spell("--resume", "resume=True")


@lru_cache(maxsize=1)
def _file_mode() -> int:
    """0o666 less the user's umask: what a plain open() would create."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary file in the same directory, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, _file_mode())  # mkstemp creates 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: Path, obj: Any) -> None:
    _atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n"))


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    """A run's run.json: every run.json is written here (through a temporary file and a rename)."""
    write_json(directory / "run.json", meta)


def versions() -> dict[str, str]:
    """The versions of spectra and of the libraries its numbers depend on, as run.json records them."""
    from importlib import metadata

    found = {}
    for name in ("spectra-attention", "torch", "transformers", "datasets", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def write_table(path: Path, frame: pd.DataFrame) -> None:
    """A tidy CSV table; a `.tsv` name is a bare matrix instead (tab-separated, no header, full precision), the
    layout other tools read with np.loadtxt (DuoAttention's full_attention_heads.tsv); a `.json` name is a one-row
    frame written as one JSON object (DuoAttention's config.json beside it)."""
    if path.suffix == ".tsv":
        _atomic(path, lambda tmp: np.savetxt(tmp, frame.to_numpy(float), delimiter="\t"))
        return
    if path.suffix == ".json":
        if len(frame) != 1:
            raise ValueError(f"{path.name}: a JSON table is one row, got {len(frame)}")
        write_json(path, json.loads(frame.iloc[0].to_json()))  # numpy scalars as plain JSON numbers
        return
    _atomic(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)

    _atomic(path, write)


def check_writable(path: Path, what: str = "--out", *, inside: bool = False) -> None:
    """`path` can be written (checked before any work): its nearest existing ancestor is a directory that accepts a
    new file. With `inside`, an existing `path` is itself that directory (a folder the figures go into).

    Permissions alone do not say it: root passes every permission check, yet /proc and /sys refuse new files and a
    read-only file system refuses everyone. So the directory is asked the real question: a probe file is created
    in it and removed at once.
    """
    if inside and path.exists() and not path.is_dir():
        raise SpectraError(f"cannot write into {path}: it is a file, not a directory; choose another {spell(what)}")
    ancestor = path.absolute() if inside and path.exists() else path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    refused = f"cannot write {path}: {ancestor} is not a writable directory; choose another {spell(what)}"
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise SpectraError(refused)
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=".spectra-probe-")
    except OSError:
        raise SpectraError(refused) from None
    os.close(fd)
    os.unlink(probe)


def _lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def lock_holder(out: Path) -> str | None:
    """The process id written in the lock of a run being written at `out`, or None when no run holds it."""
    path = _lock_path(out)
    if not path.exists():
        return None
    try:
        with open(path, "r+") as handle:
            if fcntl is None:  # pragma: no cover - an existing lock file is held
                return handle.read().strip() or "unknown"
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return handle.read().strip() or "unknown"
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None
    except OSError:
        return None


class RunDir:
    """Where a run is written: checks the target before anything touches the disk."""

    def __init__(self, out: Path | str, *, overwrite: bool = False, resume: bool = False, lock: bool = True) -> None:
        """`lock=False` for the processes of a distributed run other than the first, which writes."""
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.overwrite, self.resume, self.lock = overwrite, resume, lock
        holder = lock_holder(self.out) if lock else None
        if holder is not None:
            raise SpectraError(f"{self.out} is being written by another spectra run (process {holder}); wait for it "
                               f"to finish or choose another {spell('--out')}")
        self.check()

    def check(self) -> None:
        """Refuse a target that holds something this run may not replace or continue, or cannot be written. Asked
        when the run is set up (before anything loads) and again once its lock is held (`claimed`), when no other
        run can change the answer: a run that finished in between is then seen."""
        overwrite, resume = self.overwrite, self.resume
        if self.out.exists() and not self.out.is_dir():
            raise SpectraError(f"output path {self.out} exists and is not a directory; choose another "
                               f"{spell('--out')}")
        if self.out.exists() and not (overwrite or resume):
            raise SpectraError(f"run directory {self.out} already exists; pass {OVERWRITE} to replace it or choose "
                               f"another {spell('--out')}")
        if self.partial.exists() and not (overwrite or resume):
            raise SpectraError(f"an interrupted run is at {self.partial}; pass {RESUME} to continue it or "
                               f"{OVERWRITE} to start over")
        check_writable(self.out)

    @property
    def complete(self) -> bool:
        """True when resuming onto a finished run."""
        if self.resume and self.out.is_dir() and not (self.out / "run.json").exists() and any(self.out.iterdir()):
            raise SpectraError(f"{self.out} exists but holds no run.json: it is not a spectra run to resume; choose "
                               f"another {spell('--out')} (or pass {OVERWRITE} to replace it)")
        return self.resume and (self.out / "run.json").exists()

    def _damaged(self, path: Path, what: str, run: Path) -> SpectraError:
        """The refusal of a run that cannot be resumed because `path` (one of its files) is damaged."""
        return SpectraError(f"{path} is damaged ({what}), so {run} cannot be resumed; pass {OVERWRITE} to start "
                            "afresh")

    def _read_meta(self, directory: Path) -> dict[str, Any]:
        """A run.json of this run (finished or interrupted) that --resume compares against; damage is one line."""
        path = directory / "run.json"
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError:
            raise self._damaged(path, "missing beside its checkpoint", directory) from None
        except (OSError, UnicodeDecodeError, ValueError):
            raise self._damaged(path, "truncated or not JSON", directory) from None
        if not isinstance(meta, dict) or not isinstance(meta.get("settings"), dict):
            raise self._damaged(path, "no settings recorded", directory)
        return meta

    def finished_meta(self) -> dict[str, Any]:
        return self._read_meta(self.out)

    @property
    def checkpointed(self) -> bool:
        """Whether the partial directory holds a checkpoint: a single process's, or a shard of several."""
        return (self.partial / CHECKPOINT).exists() or any((self.partial / SHARDS).glob("*.npz"))

    def checkpoint_meta(self) -> dict[str, Any] | None:
        """The run.json of the interrupted run being resumed, or None to start fresh; a damaged checkpoint or
        run.json is refused here, before the model loads (the archive's checksums are verified, not kept; shards
        are checked as `spectra.shards` reads them)."""
        checkpoint = self.partial / CHECKPOINT
        if not self.resume or not self.checkpointed:
            return None
        meta = self._read_meta(self.partial)
        if not checkpoint.exists():
            return meta
        try:
            with zipfile.ZipFile(checkpoint) as archive:
                whole = archive.testzip() is None and "done.npy" in archive.namelist()
        except (OSError, EOFError, zipfile.BadZipFile):
            whole = False
        if not whole:
            raise self._damaged(checkpoint, "truncated or not a checkpoint written by spectra", self.partial)
        return meta

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        """Hold the run directory's lock for the block, and check the target again under it (`check`): a run that
        wrote the same place since this one was set up is seen, not replaced. The loop takes it before the model
        loads, so a second run started meanwhile is refused at once. Parent directories are created for the lock
        file, and removed again when the block leaves them empty (a run refused after its set-up leaves no trace)."""
        if not self.lock:
            yield
            return
        created = [parent for parent in self.out.absolute().parents if not parent.exists()]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        path = _lock_path(self.out)
        try:
            handle = self._acquire(path)
            try:
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                self.check()
                yield
            finally:
                path.unlink(missing_ok=True)
                handle.close()
        finally:
            for parent in created:  # deepest first
                with contextlib.suppress(OSError):
                    parent.rmdir()

    def _acquire(self, path: Path):
        """The lock file at `path`, opened and locked exclusively (its old content cleared), or a refusal naming
        the process that holds it. A lock file its holder removed while this one waited for it (the holder's run
        finished) is opened afresh, so two runs never hold two files of the same name."""
        if fcntl is None:  # pragma: no cover
            try:
                return os.fdopen(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY), "w")
            except FileExistsError:
                raise SpectraError(f"{self.out} is being written by another spectra run; choose another "
                                   f"{spell('--out')}") from None
        while True:
            handle = open(path, "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise SpectraError(f"{self.out} is being written by another spectra run (process {holder}); wait "
                                   f"for it to finish or choose another {spell('--out')}") from None
            try:
                same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                handle.seek(0)
                handle.truncate()
                return handle
            handle.close()

    def begin(self, meta: dict[str, Any]) -> None:
        """Record the run's settings; the partial directory appears with the first checkpoint."""
        self.meta = meta
        self._created = self._cleared = False

    def clear(self, first: bool) -> None:
        """Before the processes of a run write their shards: the `first` process removes a partial directory this
        run replaces (one it does not resume) now, before the others start (a barrier), rather than at its first
        checkpoint, when another process's shard may be in it; no process removes it later."""
        if first and self.partial.exists() and not (self.resume and self.checkpointed):
            shutil.rmtree(self.partial)
        self._cleared = True

    def _ensure(self) -> None:
        if self._created:
            return
        resuming = self._cleared or (self.resume and self.checkpointed)
        if self.partial.exists() and not resuming:
            shutil.rmtree(self.partial)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.partial.mkdir(exist_ok=True)
        self._created = True

    def save_checkpoint(self, arrays: dict[str, np.ndarray], done: int, **meta: Any) -> None:
        """Save the probes' state after `done` sequences, and the settings to resume with."""
        self._ensure()
        write_arrays(self.partial / CHECKPOINT, {**arrays, "done": np.array(done)})
        write_meta(self.partial, {**self.meta, "status": "running", **meta})

    def save_progress(self, first: bool, **meta: Any) -> None:
        """Record the settings to resume with beside the processes' shards: the `first` process each time (its
        `meta`: the wall time so far), another only while none is there, so no shard is ever without them."""
        self._ensure()
        if first or not (self.partial / "run.json").exists():
            write_meta(self.partial, {**self.meta, "status": "running", **meta})

    def load_checkpoint(self) -> tuple[dict[str, np.ndarray], int]:
        """A single process's checkpoint: the probes' state and how many sequences (the first ones) it holds; none
        (an empty state, 0) where only the shards of several processes are."""
        if not (self.partial / CHECKPOINT).exists():
            return {}, 0
        with np.load(self.partial / CHECKPOINT, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        return arrays, int(arrays.pop("done"))

    def finish(self, meta: dict[str, Any], tables: dict[str, pd.DataFrame],
               arrays: dict[str, dict[str, np.ndarray]], late: Callable[[], dict[str, Any]] | None = None) -> Path:
        """Write the results into the partial directory and move it into place; `late()` gives run.json fields
        known only once the tables and arrays are written (the stage timings, writing included)."""
        self._ensure()
        for name, frame in tables.items():
            write_table(self.partial / name, frame)
        for name, group in arrays.items():
            write_arrays(self.partial / name, group)
        write_meta(self.partial, {**meta, **(late() if late else {})})
        (self.partial / CHECKPOINT).unlink(missing_ok=True)
        shutil.rmtree(self.partial / SHARDS, ignore_errors=True)
        old = None
        if self.out.exists():
            old = self.out.with_name(self.out.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
        os.replace(self.partial, self.out)
        if old is not None:
            shutil.rmtree(old)
        return self.out


def default_dir(base: Path, source: str) -> Path:
    """`base`, or `base-2`, `base-3`, … when a run of another model (its resolved `source`) holds the name."""
    candidate, number = base, 1
    while True:
        found = [path / "run.json" for path in (candidate, candidate.with_name(candidate.name + ".partial"))]
        owners = []
        for meta in found:
            try:
                owners.append(json.loads(meta.read_text())["model"].get("source"))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
        if not owners or source in owners or not (candidate.exists() or found[1].parent.exists()):
            return candidate
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
