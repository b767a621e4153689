"""The run directory: atomic writes, run.json metadata, tidy tables, checkpoints, loading back.

A run is built in `<out>.partial/` (checkpoints land there too) and renamed to `<out>` only when
complete, so an interrupted or failed run never looks finished and an existing run is replaced only
after its successor is whole. Nothing is pickled: JSON, CSV and `.npz` read with allow_pickle=False.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from .errors import SpectraError

CHECKPOINT = "checkpoint.npz"


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary file in the same directory, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: Path, obj: Any) -> None:
    _atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n"))


def write_table(path: Path, frame: pd.DataFrame) -> None:
    _atomic(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)

    _atomic(path, write)


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


class RunDir:
    """Where a run is written: checks the target before anything touches the disk."""

    def __init__(self, out: Path | str, *, overwrite: bool = False, resume: bool = False) -> None:
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.overwrite, self.resume = overwrite, resume
        if self.out.exists() and not self.out.is_dir():
            raise SpectraError(f"output path {self.out} exists and is not a directory; choose another --out")
        if self.out.exists() and not (overwrite or resume):
            raise SpectraError(f"run directory {self.out} already exists; pass --overwrite to replace it or choose another --out")
        if self.partial.exists() and not (overwrite or resume):
            raise SpectraError(
                f"an interrupted run is at {self.partial}; pass --resume to continue it or --overwrite to start over"
            )

    @property
    def complete(self) -> bool:
        """True when resuming onto a finished run (nothing left to do)."""
        return self.resume and (self.out / "run.json").exists()

    def checkpoint_meta(self) -> dict[str, Any] | None:
        """The settings of the interrupted run being resumed, or None to start fresh."""
        path = self.partial / "run.json"
        if not self.resume or not (self.partial / CHECKPOINT).exists() or not path.exists():
            return None
        return json.loads(path.read_text())

    def begin(self, meta: dict[str, Any]) -> None:
        """Record the run's settings; the partial directory appears with the first checkpoint."""
        self.meta = meta
        self._created = False

    def _ensure(self) -> None:
        if self._created:
            return
        resuming = self.resume and (self.partial / CHECKPOINT).exists()
        if self.partial.exists() and not resuming:
            shutil.rmtree(self.partial)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.partial.mkdir(exist_ok=True)
        self._created = True

    def save_checkpoint(self, arrays: dict[str, np.ndarray], done: int, **meta: Any) -> None:
        """Save the probes' state after `done` sequences, and the settings to resume with."""
        self._ensure()
        write_arrays(self.partial / CHECKPOINT, {**arrays, "done": np.array(done)})
        write_json(self.partial / "run.json", {**self.meta, "status": "running", **meta})

    def load_checkpoint(self) -> tuple[dict[str, np.ndarray], int]:
        arrays = read_arrays(self.partial / CHECKPOINT)
        return arrays, int(arrays.pop("done"))

    def finish(self, meta: dict[str, Any], tables: dict[str, pd.DataFrame], arrays: dict[str, dict[str, np.ndarray]]) -> Path:
        """Write the results into the partial directory and move it into place."""
        self._ensure()
        for name, frame in tables.items():
            write_table(self.partial / name, frame)
        for name, group in arrays.items():
            write_arrays(self.partial / name, group)
        write_json(self.partial / "run.json", meta)
        (self.partial / CHECKPOINT).unlink(missing_ok=True)
        old = None
        if self.out.exists():
            old = self.out.with_name(self.out.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
        os.replace(self.partial, self.out)
        if old is not None:
            shutil.rmtree(old)
        return self.out


@dataclass
class Run:
    """An `analyze` run loaded back: metadata, the per-(layer, head) table and the curves.

    Curves are arrays indexed (layer, head, index) with index j = 1…n on the relative grid j/n:
    `cum_mean`/`cum_std` the normalized cumulative singular value, `sigma_mean`/`sigma_std` the
    singular values at absolute index (zero past a sequence's length).
    """

    path: Path
    meta: dict[str, Any]
    metrics: pd.DataFrame
    cum_mean: np.ndarray
    cum_std: np.ndarray
    sigma_mean: np.ndarray
    sigma_std: np.ndarray

    @property
    def layers(self) -> int:
        return self.cum_mean.shape[0]

    @property
    def heads(self) -> int:
        return self.cum_mean.shape[1]

    @property
    def n(self) -> int:
        return self.cum_mean.shape[2]

    @property
    def at(self) -> int:
        return int(self.meta["at"])

    @property
    def label(self) -> str:
        """model · data, and the mode when it is not the paper's pack mode."""
        mode = self.meta["data"].get("mode", "pack")
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}" + ("" if mode == "pack" else f" ({mode})")

    def curves(self) -> pd.DataFrame:
        """The curves as a tidy frame: one row per (layer, head, index)."""
        layer, head, index = np.meshgrid(
            np.arange(self.layers), np.arange(self.heads), np.arange(1, self.n + 1), indexing="ij"
        )
        return pd.DataFrame(
            {
                "layer": layer.ravel(),
                "head": head.ravel(),
                "index": index.ravel(),
                "cum_mean": self.cum_mean.ravel(),
                "cum_std": self.cum_std.ravel(),
                "sigma_mean": self.sigma_mean.ravel(),
                "sigma_std": self.sigma_std.ravel(),
            }
        )


@dataclass
class ApproxRun:
    """A `spectra approx` run loaded back.

    `heads`: one row per (method, budget, layer, head, metric) with samples, mean, median, p95, max,
    target and pr_below_target; `end_to_end`: one row per (method, budget), or None without --end-to-end.
    """

    path: Path
    meta: dict[str, Any]
    heads: pd.DataFrame
    end_to_end: pd.DataFrame | None

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"

    def per_layer(self, metric: str = "out_err") -> pd.DataFrame:
        """Mean over heads of each head's mean error: one row per (method, budget, layer)."""
        rows = self.heads[self.heads["metric"] == metric]
        return rows.groupby(["method", "budget", "layer"], sort=False)["mean"].mean().reset_index(name=metric)

    def k_needed(self, target: float | None = None, metric: str = "out_err") -> pd.DataFrame:
        """Per (method, layer), the smallest budget whose per-layer mean error is ≤ target (NaN if none)."""
        target = self.meta["target"] if target is None else target
        layer = self.per_layer(metric)
        reached = layer[layer[metric] <= target].groupby(["method", "layer"], sort=False)["budget"].min()
        frame = layer[["method", "layer"]].drop_duplicates().set_index(["method", "layer"])
        frame["k_needed"] = reached
        return frame.reset_index()


@dataclass
class TheoremRun:
    """A `spectra theorems` run loaded back: for each theorem, tables pooled over layers and heads
    (`theorem1`, `theorem2`), per layer (`*_layers`) and per head (`*_heads`); see theory.py for columns."""

    path: Path
    meta: dict[str, Any]
    tables: dict[str, pd.DataFrame]

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / "run.json"
    if not meta_path.is_file():
        hint = " (an interrupted run: finish it with --resume)" if path.name.endswith(".partial") else ""
        raise SpectraError(f"{path} is not a spectra run directory: it has no run.json{hint}")
    try:
        return json.loads(meta_path.read_text())
    except (OSError, ValueError) as error:
        raise SpectraError(f"{path}/run.json is not readable: {error}") from None


def load_run(path: Path | str) -> Run | ApproxRun | TheoremRun:
    """Load a finished run directory (`analyze` → Run, `approx` → ApproxRun, `theorems` → TheoremRun)."""
    path = Path(path)
    meta = _read_meta(path)
    try:
        if meta.get("kind") == "approx":
            e2e = path / "end_to_end.csv"
            e2e_table = pd.read_csv(e2e, dtype={"layers": str}) if e2e.exists() else None
            return ApproxRun(path, meta, pd.read_csv(path / "heads.csv"), e2e_table)
        if meta.get("kind") == "theorems":
            names = [f"theorem{i}{scope}" for i in (1, 2) for scope in ("", "_layers", "_heads")]
            return TheoremRun(path, meta, {name: pd.read_csv(path / f"{name}.csv") for name in names})
        if meta.get("kind") != "analyze":
            raise SpectraError(f"{path} holds a '{meta.get('kind')}' run, which load_run cannot read")
        metrics = pd.read_csv(path / "metrics.csv")
        curves = read_arrays(path / "curves.npz")
    except (OSError, ValueError, KeyError) as error:
        raise SpectraError(f"{path} is not a readable spectra run: {error}") from None
    return Run(path, meta, metrics, curves["cum_mean"], curves["cum_std"], curves["sigma_mean"], curves["sigma_std"])
