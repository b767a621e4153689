"""LU-KV's budget curves: for each of 99 target ratios (1 % … 99 %), the share of each layer's and key/value head's
cache to prune, computed offline for one model and one scorer (the LU-KV repository's `generate_curve.sh`).

A curve is a NumPy `.npy` file holding a float array (99, layers, H_kv) — the file kvpress 0.5.5's `LUKVPress`
downloads for its one published curve (Llama-3.1-8B-Instruct with ExpectedAttentionPress(epsilon=2e-2)), read here
from a local path instead, since spectra reaches no network. Row i is the target ratio (i + 1) %. Torch-free: the
registry checks `lukv(FILE)`'s argument with `check` before the model loads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import SpectraError

#: the target ratios a curve holds, 1 % … 99 %
TARGETS = 99


def read(path: str | Path) -> np.ndarray:
    """The curve in the `.npy` file `path`, (99, layers, H_kv) float64; SpectraError (one line) when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise SpectraError(f"LU-KV budget curve {path}: no such file (a .npy array of 99 × layers × key/value heads "
                           "prune ratios, as the LU-KV repository's generate_curve.sh writes)")
    try:
        curve = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise SpectraError(f"LU-KV budget curve {path}: not a .npy array ({error})") from None
    if curve.ndim != 3 or curve.shape[0] != TARGETS or 0 in curve.shape or curve.dtype.kind not in "fiu":
        raise SpectraError(f"LU-KV budget curve {path}: must be a numeric array of shape ({TARGETS}, layers, key/value "
                           f"heads), got {curve.dtype} {curve.shape}")
    if not np.all(np.isfinite(curve)):
        raise SpectraError(f"LU-KV budget curve {path}: holds a value that is not finite")
    return curve.astype(np.float64)


def check(argument: str) -> None:
    """The registry's check of `lukv(FILE)`'s argument: the file holds a readable curve."""
    read(argument)


def fits(curve: np.ndarray, layers: int | None, kv_heads: int | None, name: str, where: str) -> None:
    """Refuse (one line) a curve whose layers × key/value heads are not the model's (None: unknown, not checked)."""
    if (layers is not None and curve.shape[1] != layers) or (kv_heads is not None and curve.shape[2] != kv_heads):
        raise SpectraError(f"{where} is a budget curve for {curve.shape[1]} layers × {curve.shape[2]} key/value heads, "
                           f"but {name} has {layers if layers is not None else '?'} × "
                           f"{kv_heads if kv_heads is not None else '?'}")


def row(ratio: float) -> int:
    """The curve's row for `ratio`, as kvpress picks it: round(100 · r) − 1 (Python's rounding), within 0 … 98."""
    return max(0, min(TARGETS - 1, int(round(ratio * 100)) - 1))
