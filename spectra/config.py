"""The choice sets, the checks several options share, and the run configuration: one object, declared once.

Choice sets are `Choice` enums: typer reads them (so `--help` lists the choices and a wrong one is a usage error)
and so do the option dataclasses, which turn a plain string from the Python API into the enum or raise one
`SpectraError` line. Each analysis declares its own options beside it (`spectra.kinds`); what every run shares
is `RunConfig`. Checks that need the model's shape (layers, heads, positions) run before it loads, from its
config file (`checkpoints.Shape`).

This module imports neither torch nor transformers, so the command line starts fast.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .errors import SpectraError, spell
from .inputs import path_text, several
from .options import option


class Choice(str, enum.Enum):
    """A choice set whose members are their own string values (JSON writes them as plain strings)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> list[str]:
        return [member.value for member in cls]


class Mode(Choice):
    """How documents become sequences: packed into blocks of exactly n tokens, or one document each."""

    PACK = "pack"
    TRUNCATE = "truncate"


class Place(Choice):
    """Where the singular values are computed: auto (the batched GPU route where it can run, else timed on the
    first layer), the CPU, the model's device with torch's solvers, or the batched cuSOLVER route on its GPU."""

    AUTO = "auto"
    CPU = "cpu"
    SAME = "same"
    CUDA = "cuda"


class Device(Choice):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"


class DType(Choice):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class Projection(Choice):
    """Random projections of jl/linformer: Gaussian N(0, 1/k) entries or scaled orthonormal rows."""

    GAUSSIAN = "gaussian"
    ORTHOGONAL = "orthogonal"


class FitInit(Choice):
    """Where `linformer-fit` starts: mean pooling (eq. 7 with E = F = M, the pool-mean method) or PCA."""

    POOLING = "pooling"
    PCA = "pca"


class Sharing(Choice):
    """Linformer's sharing of E, F: per head, per layer (headwise), E = F per layer (kv), one for all (layerwise)."""

    NONE = "none"
    HEADWISE = "headwise"
    KV = "kv"
    LAYERWISE = "layerwise"


class LocalLayers(Choice):
    """What a press does to a model's sliding-window (local) layers, Gemma 3's five of six (`spectra.sliding`): keep
    (each keeps its window, W − 1 tokens, as the model does; the press compresses the global layers), compress (the
    press compresses what each local layer holds, its window, at the same ratio), or kvpress (what kvpress 0.5.5's
    pipeline does on Gemma3ForCausalLM: every layer compressed from the whole context, the window then counting cache
    rows, not positions; `kv.cell` says it in full)."""

    KEEP = "keep"
    COMPRESS = "compress"
    KVPRESS = "kvpress"


C = TypeVar("C", bound=Choice)


def choose(choices: type[C], value: str | C, option: str) -> C:
    """`value` as a member of `choices`, or one line naming the option and its choices."""
    try:
        return choices(value)
    except ValueError:
        raise SpectraError(f"unknown {spell(option)} '{value}'; use one of {', '.join(choices.values())}") from None


# ---------------------------------------------------------------- single checks shared by several options


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpectraError(f"{spell('--seed')} must be a non-negative integer, got {seed!r}")
    return seed


def check_budget(budget: int, n: int | None = None, what: str = "the sequence length n") -> int:
    """One budget (the paper's k: projected dimension, features, landmarks, keys per query): a positive integer,
    at most n when n is given."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise SpectraError(f"budget {budget!r} is not a positive integer; pass e.g. "
                           f"{spell('--budget 32,64,128', 'budget=(32, 64, 128)')}")
    if n is not None and budget > n:
        raise SpectraError(f"budget {budget} exceeds {what} = {n}; use budgets ≤ {n}")
    return int(budget)


def check_budgets(budgets: Iterable[int], n: int | None = None) -> tuple[int, ...]:
    """A sweep of budgets, each checked; sorted and unique."""
    values = tuple(budgets)
    if not values:
        raise SpectraError(f"the list of budgets is empty; pass e.g. {spell('--budget 32,64,128', 'budget=(32, 64, 128)')}")
    return tuple(sorted({check_budget(value, n) for value in values}))


def check_eps(eps: Iterable[float] | float) -> tuple[float, ...]:
    """ε values, each strictly inside (0, 1) (the ε² − ε³ of the bounds needs it); sorted, unique."""
    values = (eps,) if isinstance(eps, (int, float)) else tuple(eps)
    if not values:
        raise SpectraError(f"the ε list is empty; pass at least one value in (0, 1), e.g. {EPS_EXAMPLE}")
    for value in values:
        if not 0.0 < float(value) < 1.0:
            raise SpectraError(f"ε must lie strictly between 0 and 1, got {value}; pass e.g. {EPS_EXAMPLE}")
    return tuple(sorted({float(value) for value in values}))


EPS_EXAMPLE = spell("--eps 0.1,0.2,0.3,0.5", "eps=(0.1, 0.2, 0.3, 0.5)")


def parse_layers(text: str | None, what: str = "layer") -> tuple[int, ...] | None:
    """'6-11' or '0,3,5-7' → sorted layer (or head, ...) indices (0-based); None, '' or 'all' → None (every one)."""
    if text is None or text.strip() in ("", "all"):
        return None
    layers: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            layers.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise SpectraError(f"{spell(f'--{what}s')} '{text}' is not a list of {what}s like 6-11 or 0,3,5-7") from None
    if not layers:
        raise SpectraError(f"{spell(f'--{what}s')} '{text}' selects no {what}")
    return tuple(sorted(layers))


def layers_label(layers: Sequence[int] | None) -> str:
    """[6, 7, 8, 11] → '6-8,11'; None → 'all'."""
    if layers is None:
        return "all"
    layers = list(layers)
    parts, start = [], layers[0]
    for previous, current in zip(layers, layers[1:] + [None]):
        if current != previous + 1:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = current
    return ",".join(parts)


# ---------------------------------------------------------------- the run


def indices(chosen: str | int | Iterable[int] | None, what: str) -> tuple[int, ...] | None:
    """Layers or heads as the user gives them — '0,3,5-7', one index, several, None or 'all' (every one) — as
    sorted unique indices, or None for all."""
    if chosen is None or isinstance(chosen, str):
        return parse_layers(chosen, what)
    return tuple(sorted(set(several(chosen, f"--{what}s"))))


@dataclass(frozen=True)
class RunConfig:
    """What a run reads and how, and where it goes: one object from the front ends down to the loop.

    The model, the data and the sequences identify the run (recorded in run.json, compared on --resume); the batch
    size, the output directory, overwrite/resume and the checkpoint cadence say how it runs. Every field is an
    option declared once (`spectra.options.option`): the command line and the Python API are built from it.
    """

    model: str | None = option(None, "Hugging Face hub id (roberta-base) or a local directory saved with "
                               "save_pretrained, or a .gguf file.", cli=False)
    data: str = option("imdb", "imdb, wikitext-103, wikitext-2, or a local .txt/.jsonl/.csv/.parquet file.")
    length: int = option(512, "Sequence length n, special tokens included; at most what the model can embed.")
    samples: int | None = option(10000, "Number of sequences; fewer if the corpus yields fewer (said at the end).")
    mode: Mode = option(Mode.PACK, "pack: documents concatenated into blocks of exactly a sequence's length; "
                        "truncate: one document per sequence, cut at that length, padded.")
    batch_size: int = option(8, "Sequences per forward pass (the results do not depend on it).", identity=False)
    seed: int = option(0, "Seed (≥ 0) of the document shuffle and of every random draw (projections, masking).")
    split: str | None = option(None, "Split of a named dataset (default: test).")
    text_column: str | None = option(None, "Column holding the text in .jsonl/.csv/.parquet files (default: text).")
    device: Device = option(Device.AUTO, "auto: cuda when present, else cpu.")
    dtype: DType = option(DType.FLOAT32, "Forward-pass dtype; spectra and errors are always float32 or better.")
    gguf_file: str | None = option(None, "A GGUF file inside the MODEL directory (or give the .gguf file as MODEL); "
                                   "needs the gguf package.")
    model_cache: bool = option(True, "Keep a GGUF model dequantized in the model cache ($SPECTRA_CACHE, else "
                               "~/.cache/spectra) and load it from there: only the first start dequantizes.",
                               negative="--no-model-cache", identity=False)
    out: str | None = option(None, "Run directory (default: under runs/, named after model, data and n).",
                             identity=False)
    overwrite: bool = option(False, "Replace an existing run directory (only once the new run is complete).",
                             identity=False)
    resume: bool = option(False, "Continue an interrupted run from its last checkpoint.", identity=False)
    trust_remote_code: bool = option(False, "Allow code shipped with the model to run (off by default).",
                                     identity=False)
    threads: int | None = option(None, "CPU threads for the forward pass and the spectra (default: one per CPU this "
                                 "process may use); fewer leaves room to other jobs on a shared machine.",
                                 identity=False)
    checkpoint_seconds: float = option(60.0, "Seconds between checkpoints.", identity=False, cli=False)

    def __post_init__(self) -> None:
        if self.length < 2:
            raise SpectraError(f"{spell('--length')} must be at least 2, got {self.length}")
        if self.samples is not None and self.samples < 1:  # None: the analysis's own default (Analysis.configured)
            raise SpectraError(f"{spell('--samples')} must be at least 1, got {self.samples}")
        if self.batch_size < 1:
            raise SpectraError(f"{spell('--batch-size')} must be at least 1, got {self.batch_size}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise SpectraError(f"{spell('--threads')} must be a positive integer, got {self.threads!r}")
        check_seed(self.seed)
        if self.resume and self.overwrite:
            raise SpectraError(f"{spell('--resume', 'resume=True')} continues the run at {spell('--out')} and "
                               f"{spell('--overwrite', 'overwrite=True')} replaces it: pass only one of them")
        for name in ("model", "data", "gguf_file", "out"):  # str or os.PathLike
            object.__setattr__(self, name, path_text(getattr(self, name)))
        for name in ("model", "data"):  # a local path is recorded absolute: --resume from another directory matches
            value = getattr(self, name)
            if value and Path(value).exists():
                object.__setattr__(self, name, str(Path(value).absolute()))
        object.__setattr__(self, "mode", choose(Mode, self.mode, "--mode"))
        object.__setattr__(self, "device", choose(Device, self.device, "--device"))
        object.__setattr__(self, "dtype", choose(DType, self.dtype, "--dtype"))

    def settings(self, extra: dict[str, Any]) -> dict[str, Any]:
        """The run's settings as run.json records them (--resume compares all but the batch size), the analysis's
        options in `extra`."""
        recorded = {name: getattr(self, name) for name in RECORDED}
        if self.gguf_file is not None:  # recorded only for GGUF models
            recorded["gguf_file"] = self.gguf_file
        return {**recorded, "extra": extra}

    def default_out(self, kind: str, label: str | None = None) -> Path:
        """runs/<model label>-<data>-n<length>[-<kind>]; `label` is the model's short name (default: its folder)."""
        model = label or Path(self.model).name or self.model
        corpus = Path(self.data).stem if Path(self.data).suffix else self.data
        suffix = "" if kind == "analyze" else f"-{kind}"
        return Path("runs") / f"{model}-{corpus}-n{self.length}{suffix}"


#: what run.json's settings record of the run configuration, in this order
RECORDED = ("model", "data", "length", "samples", "mode", "batch_size", "seed", "split", "text_column", "device",
            "dtype")


class Init(Choice):
    """How `nn.Projections` draws E, F: JL N(0, 1/k_proj) or the reference implementation's xavier_uniform."""

    JL = "jl"
    XAVIER = "xavier"


class ProjectAt(Choice):
    """Where eq. 7 projects: after W^K, W^V (the paper, E(K W^K)) or before them (reference code, (E X) W^K)."""

    AFTER = "after"
    BEFORE = "before"
