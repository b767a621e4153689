"""Finished runs as objects: `Run` (analyze), `ApproxRun`, `HeadsRun`, `TheoremRun`, `ScalingRun`, `CacheRun`, and the readers of their files.

Each analysis reads its own run back (`spectra.kinds`, whose `load_run` dispatches on run.json's kind).

Everything is read without pickle (JSON, CSV, and `.npz` with allow_pickle=False), and a missing,
damaged or foreign file is one line naming it. Writing runs is `spectra.rundir`.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import SpectraError

if TYPE_CHECKING:  # pandas is imported where a table is read: the command line's start does not pay for it
    import pandas as pd


def _size(value: Any) -> str | None:
    """A table's rows × columns or an array's shape, for a run's repr; None for anything else."""
    if type(value).__name__ == "DataFrame":
        return f"{value.shape[0]}×{value.shape[1]}"
    if isinstance(value, np.ndarray):
        return "×".join(map(str, value.shape))
    return None


class _Shown:
    """A short repr (kind, model, data, n, then each table's and array's size, then where it lives) and a dir()
    that lists what the run holds: its fields, properties and methods, without Python's own attributes."""

    path: Path
    meta: dict[str, Any]

    def _held(self) -> dict[str, Any]:
        """The tables and arrays the repr lists with their sizes (None: absent from this run)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if name not in ("path", "meta")}

    def __repr__(self) -> str:
        meta = self.meta
        parts = [f"kind={meta.get('kind', '?')!r}", f"model={meta.get('model', {}).get('name', '?')!r}",
                 f"data={meta.get('data', {}).get('name', '?')!r}"]
        if "n" in meta:
            parts.append(f"n={meta['n']}")
        if "lengths" in meta:
            parts.append(f"lengths={meta['lengths']}")
        if "samples" in meta:
            parts.append(f"samples={meta['samples']}")
        for name in ("methods", "budget", "eps"):  # approx and theorems: what was measured
            if name in meta:
                parts.append(f"{name}={meta[name]}")
        groups: list[tuple[list[str], str]] = []  # neighbours of one size share an entry: cum_mean/cum_std=6×12×128
        for name, value in self._held().items():
            size = _size(value)
            if size is not None and groups and groups[-1][1] == size:
                groups[-1][0].append(name)
            elif size is not None:
                groups.append(([name], size))
        parts += [f"{'/'.join(names)}={size}" for names, size in groups]
        parts.append(f"path={str(self.path)!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __dir__(self) -> list[str]:
        names = set(self.__dataclass_fields__)
        for cls in type(self).__mro__:
            names.update(name for name in vars(cls) if not name.startswith("_"))
        return sorted(names)


def read_table(path: Path, name: str, *, optional: bool = False, **options: Any) -> pd.DataFrame | None:
    """A run's CSV table `name` (None when `optional` and absent); a missing or damaged one is one line."""
    file = path / name
    if optional and not file.exists():
        return None
    import pandas as pd

    try:
        return pd.read_csv(file, **options)
    except FileNotFoundError:
        raise SpectraError(f"{file} is missing: the run directory is incomplete") from None
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise SpectraError(f"{file} is damaged or not written by spectra ({str(error).splitlines()[0]})") from None


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz file written by spectra; a truncated or foreign file is one line."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise SpectraError(f"{path} is missing: the run directory is incomplete") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):
        raise SpectraError(f"{path} is damaged or not written by spectra") from None


@dataclass(repr=False)
class Run(_Shown):
    """An `analyze` run loaded back: metadata, the per-(layer, head) table and the curves.

    Curves are arrays indexed (layer, head, index) with index j = 1…n on the relative grid j/n:
    `cum_mean`/`cum_std` the normalized cumulative singular value, `sigma_mean`/`sigma_std` the
    singular values at absolute index (zero past a sequence's length). `qkv`: the query/key/value spectra
    table (one row per tensor, stage, layer, head) when the run measured them, else None.
    """

    path: Path
    meta: dict[str, Any]
    metrics: pd.DataFrame
    cum_mean: np.ndarray
    cum_std: np.ndarray
    sigma_mean: np.ndarray
    sigma_std: np.ndarray
    qkv: pd.DataFrame | None = None

    @property
    def causal(self) -> bool:
        """Whether the model is a decoder (its P is lower triangular)."""
        return bool(self.meta["model"].get("causal", False))

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
        import pandas as pd

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


@dataclass(repr=False)
class ApproxRun(_Shown):
    """A `spectra approx` run loaded back.

    `head_stats`: one row per (method, budget, layer, head, metric) with samples, mean (and its 95% interval
    mean_low, mean_high), median, p95, max, target and pr_below_target on the evaluated sequences;
    `end_to_end`: one row per (method, budget), or None without --end-to-end. With fitted methods also
    `calibration` (the same table on the calibration sequences) and `fit_history`; with a k plan `plan`
    (the table at each layer's planned k).
    """

    path: Path
    meta: dict[str, Any]
    head_stats: pd.DataFrame
    end_to_end: pd.DataFrame | None
    calibration: pd.DataFrame | None = None
    fit_history: pd.DataFrame | None = None
    plan: pd.DataFrame | None = None

    def projections(self, method: str, budget: int):
        """The projections `method` (linformer-pca(s) or linformer-fit(s)) fitted at `budget` in this run: an
        `nn.projections.Projections` for `LinformerSelfAttention` or `nn.linformer.substitute`."""
        from .nn.projections import load_projections

        return load_projections(self.path, method, budget)

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"

    def per_layer(self, metric: str = "out_err", stat: str = "mean", table: str = "head_stats") -> pd.DataFrame:
        """Mean over heads of each head's `stat` (mean, median, p95, max) of `metric` over sequences: one row per
        (method, budget, layer); `table`: head_stats (evaluated), calibration or plan."""
        frame = getattr(self, table)
        rows = frame[frame["metric"] == metric]
        return rows.groupby(["method", "budget", "layer"], sort=False)[stat].mean().reset_index(name=metric)

    def k_needed(self, target: float | None = None, metric: str = "out_err") -> pd.DataFrame:
        """Per (method, layer), the smallest budget whose per-layer mean error is ≤ target (NaN if none)."""
        target = self.meta["target"] if target is None else target
        layer = self.per_layer(metric)
        reached = layer[layer[metric] <= target].groupby(["method", "layer"], sort=False)["budget"].min()
        frame = layer[["method", "layer"]].drop_duplicates().set_index(["method", "layer"])
        frame["k_needed"] = reached
        return frame.reset_index()


@dataclass(repr=False)
class HeadsRun(_Shown):
    """A `spectra heads` run loaded back.

    `diagnosis`: one row per (layer, head) with every score (see `spectra.diagnosis`), the weight ranks and the head
    type; `weights`: σ and normalized cumulative curves of W_QK and W_OV (layers, heads, d), when the linears were
    found; `kv_heads` and `full_attention_heads` (DuoAttention's pattern: layers × KV heads) when the retrieval score
    was measured; `method_map` and `rules` when the run was joined with an approx run.
    """

    path: Path
    meta: dict[str, Any]
    diagnosis: pd.DataFrame
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    kv_heads: pd.DataFrame | None = None
    full_attention_heads: np.ndarray | None = None
    method_map: pd.DataFrame | None = None
    rules: pd.DataFrame | None = None

    def _held(self) -> dict[str, Any]:
        return {"diagnosis": self.diagnosis, **self.weights, "kv_heads": self.kv_heads,
                "full_attention_heads": self.full_attention_heads, "method_map": self.method_map}

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"

    @property
    def layers(self) -> int:
        return int(self.meta["model"]["layers"])

    @property
    def heads(self) -> int:
        return int(self.meta["model"]["heads"])

    @property
    def n(self) -> int:
        return int(self.meta["n"])


@dataclass(repr=False)
class TheoremRun(_Shown):
    """A `spectra theorems` run loaded back: for each theorem, tables pooled over layers and heads
    (`theorem1`, `theorem2`), per layer (`*_layers`) and per head (`*_heads`); see theory.py for columns."""

    path: Path
    meta: dict[str, Any]
    tables: dict[str, pd.DataFrame]

    def _held(self) -> dict[str, Any]:
        return dict(self.tables)

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"


@dataclass(repr=False)
class ScalingRun(_Shown):
    """A `spectra scaling` run loaded back: `table` (scaling.csv: per layer, head and n the ranks for 90%/99%, the
    effective rank, c at n/4), `c_fixed` (c at fixed budgets), `exponents` (growth of the ranks with n per head,
    layer and pooled, with intervals) and, with a target, `k_needed`; its analyze runs, by n, are `analyses` (also `runs()`)."""

    path: Path
    meta: dict[str, Any]
    table: pd.DataFrame
    c_fixed: pd.DataFrame
    exponents: pd.DataFrame
    k_needed: pd.DataFrame | None = None
    analyses: dict[int, Run] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"

    @property
    def lengths(self) -> list[int]:
        return list(self.meta["lengths"])

    def runs(self) -> dict[int, Run]:
        """The analyze run at each n."""
        return self.analyses


@dataclass(repr=False)
class CacheRun(_Shown):
    """A `spectra cache` run loaded back: `table` (cache.csv: per press and ratio nll, ppl, kl, top1, kept,
    kept_share, key_channel_ratio, saved; the full cache is press 'full' at ratio 0), `head_stats` (cache_heads.csv: per
    press, ratio, layer and head the attention mass kept and the output error) and `sequences` (per press, ratio and
    sequence: nll, kl, top1)."""

    path: Path
    meta: dict[str, Any]
    table: pd.DataFrame
    head_stats: pd.DataFrame
    sequences: pd.DataFrame

    @property
    def label(self) -> str:
        return f"{self.meta['model']['name']} · {self.meta['data']['name']}"
