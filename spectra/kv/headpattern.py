"""DuoAttention's head pattern as a directory: `full_attention_heads.tsv` beside `config.json` — torch-free.

DuoAttention (mit-han-lab/duo-attention, `duo_attn.utils.load_attn_pattern`) and kvpress 0.5.5's
`DuoAttentionPress.load_attention_pattern` read the same two files: the tsv, a layers × key/value heads matrix read by
`np.loadtxt(…, delimiter="\\t")` and clipped to [0, 1] (1: a retrieval head, kept at full attention; lower: a
streaming candidate), and config.json's `sink_size` and `recent_size`, the first and the last tokens a streaming head
keeps. `spectra heads` writes both into its run directory, so that directory is a pattern both tools load, and
`spectra cache --presses 'duo(DIR)'` reads it back here. A pattern is checked when it is read — a missing or damaged
file, a matrix that is not 2-D and finite, sizes that are not whole numbers ≥ 0 — in one line, before any model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpectraError

#: the files of a pattern directory, as DuoAttention and kvpress name them
HEADS_FILE, CONFIG_FILE = "full_attention_heads.tsv", "config.json"


@dataclass(frozen=True, eq=False)
class HeadPattern:
    """`scores` (layers, key/value heads) in [0, 1] (higher: more a retrieval head); `sink_size`, `recent_size`:
    the first and last context tokens a streaming head keeps."""

    scores: np.ndarray
    sink_size: int
    recent_size: int

    @property
    def layers(self) -> int:
        return self.scores.shape[0]

    @property
    def kv_heads(self) -> int:
        return self.scores.shape[1]


def read(folder: str | Path) -> HeadPattern:
    """The pattern in `folder`, clipped to [0, 1] as both loaders clip it; SpectraError (one line) when it is not
    a whole pattern."""
    folder = Path(folder)
    heads, config = folder / HEADS_FILE, folder / CONFIG_FILE
    if not folder.is_dir():
        raise SpectraError(f"DuoAttention pattern {folder}: no such directory (a `spectra heads` run directory, or "
                           f"any directory holding {HEADS_FILE} and {CONFIG_FILE})")
    for path in (heads, config):
        if not path.is_file():
            raise SpectraError(f"DuoAttention pattern {folder}: {path.name} is missing (`spectra heads` writes both "
                               f"{HEADS_FILE} and {CONFIG_FILE})")
    try:
        scores = np.loadtxt(heads, dtype=float, delimiter="\t", ndmin=2)
    except ValueError as error:
        raise SpectraError(f"DuoAttention pattern {heads}: not a tab-separated matrix of numbers ({error})") from None
    if scores.size == 0 or not np.all(np.isfinite(scores)):
        raise SpectraError(f"DuoAttention pattern {heads}: holds no values or a value that is not finite")
    try:
        settings = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise SpectraError(f"DuoAttention pattern {config}: not JSON ({error})") from None
    sizes = [settings.get(name) if isinstance(settings, dict) else None for name in ("sink_size", "recent_size")]
    if any(isinstance(size, bool) or not isinstance(size, int) or size < 0 for size in sizes):
        raise SpectraError(f"DuoAttention pattern {config}: sink_size and recent_size must be whole numbers of "
                           f"tokens ≥ 0, got {sizes[0]!r} and {sizes[1]!r}")
    return HeadPattern(np.clip(scores, 0.0, 1.0), int(sizes[0]), int(sizes[1]))


def check(argument: str) -> None:
    """The registry's check of `duo(DIR)`'s argument: the directory holds a readable pattern."""
    read(argument)


def write(folder: str | Path, scores: np.ndarray, sink_size: int, recent_size: int) -> Path:
    """A pattern directory: `scores` (layers, key/value heads) as the tsv and config.json's two sizes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config(sink_size, recent_size)) + "\n")
    np.savetxt(folder / HEADS_FILE, np.asarray(scores, dtype=float), delimiter="\t")
    return folder


def config(sink_size: int, recent_size: int) -> dict[str, int]:
    """config.json's content: what both loaders read of it."""
    return {"sink_size": int(sink_size), "recent_size": int(recent_size)}


def fits(pattern: HeadPattern, layers: int | None, kv_heads: int | None, name: str, where: str) -> None:
    """Refuse (one line) a pattern whose matrix is not `layers` × `kv_heads` (None: unknown, not checked)."""
    if (layers is not None and pattern.layers != layers) or (kv_heads is not None and pattern.kv_heads != kv_heads):
        raise SpectraError(f"{where} is {pattern.layers} layers × {pattern.kv_heads} key/value "
                           f"heads, but {name} has {layers if layers is not None else '?'} × "
                           f"{kv_heads if kv_heads is not None else '?'}")
