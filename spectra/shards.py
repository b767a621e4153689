"""Checkpoint shards: each process of a run checkpoints the sequences it finished into its own file.

Sequences are independent, so a process needs no other to checkpoint: at the run's cadence it writes its probe's
state and the global indices of the sequences that state holds to `<out>.partial/shards/<rank>-of-<size>-<id>.npz`
(an id of its own, so no two processes, of this start or of another, share a file), through a temporary file and a
rename, so a crash mid-write leaves its previous shard whole, and with no collective. `--resume`, with the same or
another number of processes, reads every shard and a single process's `checkpoint.npz` (whose sequences are the
first ones), skips every sequence they hold (`Held`), writes new shards beside them, and at the end combines their
states with the processes' own, each array by its reduction (`combine`, as `distributed.reduce_state` combines
processes), so the tables equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SpectraError, spell
from .rundir import CHECKPOINT, OVERWRITE, SHARDS, write_arrays
from .stats import Reduce, State

#: the arrays of a shard that are not its probe's state: the sequences it holds, what run wrote it (JSON)
INDICES, META = "shard.indices", "shard.meta"
_REDUCE = {Reduce.SUM: np.sum, Reduce.MIN: np.min, Reduce.MAX: np.max}


@dataclass(frozen=True)
class Shard:
    """One process's checkpoint: its file, the sequences its state holds, and what run wrote it (`kind`,
    `settings`, `data`, `rank`, `processes`)."""

    path: Path
    indices: frozenset[int]
    meta: dict[str, Any]

    def state(self) -> dict[str, np.ndarray]:
        """The probe's arrays the shard holds (read when the run combines them, at its end)."""
        with np.load(self.path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files if name not in (INDICES, META)}


def folder(partial: Path) -> Path:
    return partial / SHARDS


class Writer:
    """This process's shard: the sequences it finished since it started, rewritten whole at each checkpoint."""

    def __init__(self, partial: Path, meta: Mapping[str, Any], rank: int, size: int) -> None:
        """`meta`: what identifies the run (its `kind`, `settings`, `data`), recorded in the shard."""
        self.path = folder(partial) / f"{rank}-of-{size}-{uuid.uuid4().hex[:12]}.npz"
        self.meta = {**meta, "rank": rank, "processes": size}
        self.indices: list[int] = []
        self.saved = 0

    def add(self, indices: Iterable[int]) -> None:
        self.indices.extend(int(index) for index in indices)

    @property
    def pending(self) -> bool:
        """Whether it holds sequences its file does not yet."""
        return len(self.indices) > self.saved

    def save(self, state: Mapping[str, np.ndarray]) -> None:
        """The state and the indices it holds, in one file written through a temporary file and a rename."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_arrays(self.path, {**state, INDICES: np.array(sorted(self.indices), dtype=np.int64),
                                 META: np.array(json.dumps(self.meta))})
        self.saved = len(self.indices)


def _damaged(path: Path, what: str, partial: Path) -> SpectraError:
    return SpectraError(f"{path} is damaged ({what}), so {partial} cannot be resumed; remove it to run its sequences "
                        f"again, or pass {OVERWRITE} to start afresh")


def _read(path: Path, partial: Path) -> Shard:
    """One shard, its archive's checksums verified (its state is read later, at the run's end)."""
    try:
        with zipfile.ZipFile(path) as archive:
            whole = archive.testzip() is None and {f"{INDICES}.npy", f"{META}.npy"} <= set(archive.namelist())
        if whole:
            with np.load(path, allow_pickle=False) as data:
                indices, meta = data[INDICES], json.loads(str(data[META]))
    except (OSError, EOFError, ValueError, zipfile.BadZipFile):
        whole = False
    if not whole or not isinstance(meta, dict) or not isinstance(meta.get("settings"), dict) or indices.ndim != 1:
        raise _damaged(path, "truncated or not a shard written by spectra", partial)
    return Shard(path, frozenset(int(index) for index in indices), meta)


def read(partial: Path, kind: str, differ: Callable[[dict[str, Any]], list[str]]) -> tuple[Shard, ...]:
    """The shards of `partial`, each checked before the model loads: whole, written by a run of this `kind` with the
    settings `differ` finds no difference in, and holding no sequence another shard holds. A temporary file a
    crash left mid-write is not a shard (only `.npz` names are)."""
    found = tuple(_read(path, partial) for path in sorted(folder(partial).glob("*.npz")))
    for shard in found:
        changed = [] if shard.meta.get("kind") == kind else ["kind"]
        changed = changed or differ(shard.meta["settings"])
        if changed:
            raise SpectraError(f"{shard.path} was written by a run with different {', '.join(changed)}: it is not a "
                               f"shard of {partial}; remove it, or pass {OVERWRITE} to start over (or choose "
                               f"another {spell('--out')})")
    seen: dict[int, Path] = {}
    for shard in found:
        for index in shard.indices:
            if index in seen:
                raise _damaged(shard.path, f"sequence {index} is also in {seen[index].name}", partial)
            seen[index] = shard.path
    return found


@dataclass(frozen=True)
class Held:
    """The sequences a resumed run already holds: a single process's checkpoint's first `prefix` ones and those of
    its `shards`; `in` says whether a sequence is held, `len` how many are."""

    prefix: int = 0
    shards: tuple[Shard, ...] = ()
    indices: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", frozenset(index for shard in self.shards for index in shard.indices
                                                     if index >= self.prefix))

    def __contains__(self, index: int) -> bool:
        return 0 <= index < self.prefix or index in self.indices

    def __len__(self) -> int:
        return self.prefix + len(self.indices)

    def states(self, partial: Path) -> Iterator[dict[str, np.ndarray]]:
        """The held states: the single process's checkpoint's (when it holds sequences), then each shard's."""
        if self.prefix:
            with np.load(partial / CHECKPOINT, allow_pickle=False) as data:
                yield {name: data[name] for name in data.files if name != "done"}
        for shard in self.shards:
            yield shard.state()


def combine(state: State, combined: Mapping[str, np.ndarray], held: Iterable[Mapping[str, np.ndarray]],
            where: Path) -> dict[str, np.ndarray]:
    """The processes' `combined` arrays with the `held` states', each array by the reduction `state` tags it with,
    in float64 and cast back, as `distributed.reduce_state` combines processes. A held state that lacks an array or
    has another shape (written by another spectra) is refused in one line naming `where`."""
    parts: dict[str, list[np.ndarray]] = {name: [np.asarray(combined[name], dtype=np.float64)] for name in state}
    for arrays in held:
        for name, part in parts.items():
            if name not in arrays or np.shape(arrays[name]) != part[0].shape:
                raise SpectraError(f"a checkpoint in {where} holds no {name} of the run's shape (written by another "
                                   f"spectra?); pass {OVERWRITE} to start over")
            part.append(np.asarray(arrays[name], dtype=np.float64))
    return {name: _REDUCE[state[name].reduce](np.stack(part), axis=0).astype(np.asarray(combined[name]).dtype)
            for name, part in parts.items()}

