"""Every option of every analysis, declared once: choice sets, the run's configuration, each analysis's options.

Choice sets are `Choice` enums: typer reads them (so `--help` lists the choices and a wrong one is a
usage error) and so do the dataclasses below, which turn a plain string from the Python API into the
enum or raise one `SpectraError` line. Validation lives here and nowhere else; checks that need the
model (its layer count, how long a sequence it can embed) happen once it is loaded.

This module imports neither torch nor transformers, so the command line starts fast.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence, TypeVar

from .errors import SpectraError, option as spell
from .inputs import path_text


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


class Spectrum(Choice):
    """exact: c within 1e-6 of a float64 SVD (float64 Gram eigenvalues, the SVD where a bound asks); fast: the
    float32 Gram matrix, c within ~2.6e-4."""

    EXACT = "exact"
    FAST = "fast"


class Place(Choice):
    """Where the singular values are computed: auto (timed on the first layer), the CPU, or the model's device."""

    AUTO = "auto"
    CPU = "cpu"
    SAME = "same"


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


C = TypeVar("C", bound=Choice)


def choose(kind: type[C], value: str | C, option: str) -> C:
    """`value` as a member of `kind`, or one line naming the option and its choices."""
    try:
        return kind(value)
    except ValueError:
        raise SpectraError(f"unknown {spell(option)} '{value}'; use one of {', '.join(kind.values())}") from None


# ---------------------------------------------------------------- single checks shared by several options


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpectraError(f"{spell('--seed')} must be a non-negative integer, got {seed!r}")
    return seed


def check_budget(budget: int, n: int | None = None, what: str = "the sequence length n") -> int:
    """One budget k (the projected dimension): a positive integer, at most n when n is given."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise SpectraError(f"k = {budget!r} is not a budget: use a positive integer k ≥ 1 (e.g. "
                           f"{spell('--k 32,64,128', 'budgets=(32, 64, 128)')})")
    if n is not None and budget > n:
        raise SpectraError(f"k = {budget} exceeds {what} = {n}; use k ≤ {n}")
    return int(budget)


def check_budgets(budgets: Iterable[int], n: int | None = None) -> tuple[int, ...]:
    """A sweep of budgets, each checked; sorted and unique."""
    values = tuple(budgets)
    if not values:
        raise SpectraError(f"the list of budgets is empty; pass e.g. {spell('--k 32,64,128', 'budgets=(32, 64, 128)')}")
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


@dataclass(frozen=True)
class RunConfig:
    """What a run reads and how: the model, the data, the sequences. Recorded in run.json."""

    model: str
    data: str
    length: int = 512
    samples: int = 10000
    mode: Mode = Mode.PACK
    batch_size: int = 8
    seed: int = 0
    split: str | None = None
    text_column: str | None = None
    device: Device = Device.AUTO
    dtype: DType = DType.FLOAT32
    trust_remote_code: bool = False
    gguf_file: str | None = None

    def __post_init__(self) -> None:
        if self.length < 2:
            raise SpectraError(f"{spell('--length')} must be at least 2, got {self.length}")
        if self.samples < 1:
            raise SpectraError(f"{spell('--samples')} must be at least 1, got {self.samples}")
        if self.batch_size < 1:
            raise SpectraError(f"{spell('--batch-size')} must be at least 1, got {self.batch_size}")
        check_seed(self.seed)
        for name in ("model", "data", "gguf_file"):  # str or os.PathLike; None only for gguf_file
            object.__setattr__(self, name, path_text(getattr(self, name)))
        for name in ("model", "data"):  # a local path is recorded absolute: --resume from another directory matches
            value = getattr(self, name)
            if value and Path(value).exists():
                object.__setattr__(self, name, str(Path(value).absolute()))
        object.__setattr__(self, "mode", choose(Mode, self.mode, "--mode"))
        object.__setattr__(self, "device", choose(Device, self.device, "--device"))
        object.__setattr__(self, "dtype", choose(DType, self.dtype, "--dtype"))

    def settings(self, extra: dict[str, Any]) -> dict[str, Any]:
        """The run's identity as run.json records it (and --resume compares), the analysis's options in `extra`."""
        recorded = asdict(self)
        del recorded["trust_remote_code"]
        if recorded["gguf_file"] is None:  # recorded only for GGUF models
            del recorded["gguf_file"]
        return {**recorded, "extra": extra}

    def default_out(self, kind: str, label: str | None = None) -> Path:
        """runs/<model label>-<data>-n<length>[-<kind>]; `label` is the model's short name (default: its folder)."""
        model = label or Path(self.model).name or self.model
        corpus = Path(self.data).stem if Path(self.data).suffix else self.data
        suffix = "" if kind == "analyze" else f"-{kind}"
        return Path("runs") / f"{model}-{corpus}-n{self.length}{suffix}"


@dataclass(frozen=True)
class SyntheticConfig:
    """Gaussian q, k, v instead of a model: n tokens, head dimension d, `heads` heads per sample."""

    n: int = 512
    d: int = 64
    heads: int = 1
    samples: int = 100
    batch_size: int = 8
    seed: int = 0
    device: Device = Device.AUTO

    def __post_init__(self) -> None:
        if self.samples < 1 or self.batch_size < 1 or self.d < 1 or self.heads < 1:
            raise SpectraError(f"{spell('--samples')}, {spell('--batch-size')}, {spell('--d')} and {spell('--heads')} "
                               "must be at least 1")
        if self.n < 2:
            raise SpectraError(f"{spell('--length')} must be at least 2, got {self.n}")
        check_seed(self.seed)
        object.__setattr__(self, "device", choose(Device, self.device, "--device"))

    def settings(self) -> dict[str, Any]:
        return {"synthetic": True, "n": self.n, "d": self.d, "heads": self.heads, "samples": self.samples,
                "batch_size": self.batch_size, "seed": self.seed}

    def default_out(self, kind: str) -> Path:
        return Path("runs") / f"synthetic-n{self.n}-d{self.d}-{kind}"


@dataclass(frozen=True)
class Output:
    """Where the run directory goes and what may happen to an existing one."""

    out: str | Path | None = None
    overwrite: bool = False
    resume: bool = False


# ---------------------------------------------------------------- each analysis's options


@dataclass(frozen=True)
class AnalyzeOptions:
    """`at`: the 1-based index of c@index (default n/4); spectrum_device and overlap change speed, not numbers;
    `qkv` adds query/key/value spectra (None: on for decoders, off for encoders); `layers`, `heads` restrict the
    spectra to those (long sequences: each spectrum costs O(n³)); `bootstrap` keeps that many Poisson-bootstrap
    replicates of the mean ranks (for confidence intervals of what depends on them, e.g. `spectra scaling`)."""

    at: int | None = None
    spectrum: Spectrum = Spectrum.EXACT
    spectrum_device: Place = Place.AUTO
    overlap: bool | None = None
    qkv: bool | None = None
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    bootstrap: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "spectrum", choose(Spectrum, self.spectrum, "--spectrum"))
        object.__setattr__(self, "spectrum_device", choose(Place, self.spectrum_device, "--spectrum-device"))
        if self.bootstrap < 0:
            raise SpectraError(f"{spell('--bootstrap')} must be a number of replicates ≥ 0, got {self.bootstrap}")

    def resolved(self, n: int) -> "AnalyzeOptions":
        """With `at` checked against n, or set to n/4."""
        if self.at is not None and not 1 <= self.at <= n:
            raise SpectraError(f"{spell('--at')} must be an index in 1…{n} (the sequence length), got {self.at}")
        return replace(self, at=self.at or max(1, n // 4))

    def identity(self) -> dict[str, Any]:
        found: dict[str, Any] = {"at": self.at, "spectrum": self.spectrum}
        for name in ("qkv", "layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                found[name] = list(value) if isinstance(value, tuple) else value
        if self.bootstrap:
            found["bootstrap"] = self.bootstrap
        return found


@dataclass(frozen=True)
class ApproxOptions:
    """Methods (registry labels) at each budget, per head and optionally substituted end to end.

    Random methods draw per sequence unless `fixed_projection`. Methods that calibrate (`Method.calibrates`;
    `methods.check_calibration` asks for ≥ 2 sequences) are fitted on the first `fit_samples` sequences (a
    `fit_validation` share held out to choose the fit's step; `fit_steps` Adam steps at `fit_lr`, from
    `fit_init`); the evaluated sequences come after them.
    `k_plan` (per layer) replaces the budgets: every method runs at its layer's k, beside a uniform k of equal
    total cost."""

    budgets: tuple[int, ...]
    methods: tuple[str, ...]
    end_to_end: bool = False
    layers: tuple[int, ...] | None = None
    target: float = 0.1
    projection: Projection = Projection.GAUSSIAN
    fixed_projection: bool = False
    fit_samples: int = 0
    fit_steps: int = 200
    fit_lr: float = 0.1
    fit_init: FitInit = FitInit.POOLING
    fit_validation: float = 0.25
    k_plan: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", check_budgets(self.budgets))
        if not 0 < self.target < 1:
            raise SpectraError(f"{spell('--target')} must be a relative error in (0, 1), got {self.target}")
        object.__setattr__(self, "projection", choose(Projection, self.projection, "--projection"))
        object.__setattr__(self, "fit_init", choose(FitInit, self.fit_init, "--fit-init"))
        if self.fit_samples < 0 or self.fit_steps < 0 or not self.fit_lr > 0 or not 0 <= self.fit_validation < 1:
            raise SpectraError(f"{spell('--fit-samples')} and {spell('--fit-steps')} must be ≥ 0, "
                               f"{spell('--fit-lr')} > 0, "
                               f"and the held-out share{spell('', ' fit_validation')} in [0, 1)")

    @property
    def fits(self) -> bool:
        return self.fit_samples > 0

    @property
    def fit_budgets(self) -> tuple[int, ...]:
        """Every k a fitted method runs at: the budgets and, under a k plan, each layer's planned k."""
        return tuple(sorted({*self.budgets, *(self.k_plan or ())}))

    def resolved(self, n: int) -> "ApproxOptions":
        check_budgets(self.budgets, n)
        for budget in self.k_plan or ():
            check_budget(budget, n)
        return self

    def identity(self) -> dict[str, Any]:
        found = {"budgets": list(self.budgets), "methods": list(self.methods), "end_to_end": self.end_to_end,
                 "layers": None if self.layers is None else list(self.layers), "target": self.target,
                 "projection": self.projection}
        if self.fixed_projection:
            found["fixed_projection"] = True
        if self.fits:
            found.update(fit_samples=self.fit_samples, fit_steps=self.fit_steps, fit_lr=self.fit_lr,
                         fit_init=self.fit_init, fit_validation=self.fit_validation)
        if self.k_plan is not None:
            found["k_plan"] = list(self.k_plan)
        return found


@dataclass(frozen=True)
class TheoremOptions:
    """The sweep of projected dimensions and of ε; `draws` random projections per sequence, or one fixed R per
    layer and k (`fixed_projection`)."""

    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)
    eps: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)
    draws: int = 1
    fixed_projection: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", check_budgets(self.budgets))
        object.__setattr__(self, "eps", check_eps(self.eps))
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 1:
            raise SpectraError(f"{spell('--draws')} must be a positive integer, got {self.draws!r}")
        if self.fixed_projection and self.draws != 1:
            raise SpectraError(f"{spell('--fixed-projection', 'fixed_projection=True')} uses one R per layer and k: it "
                               f"takes no {spell('--draws')}")

    def resolved(self, n: int) -> "TheoremOptions":
        check_budgets(self.budgets, n)
        return self

    def identity(self) -> dict[str, Any]:
        return {"budgets": list(self.budgets), "eps": list(self.eps), "draws": self.draws,
                "fixed_projection": self.fixed_projection}


class Init(Choice):
    """How `nn.Projections` draws E, F: JL N(0, 1/budget) or the reference implementation's xavier_uniform."""

    JL = "jl"
    XAVIER = "xavier"


class Compress(Choice):
    """Where eq. 7 projects: after W^K, W^V (the paper, E(K W^K)) or before them (reference code, (E X) W^K)."""

    AFTER = "after"
    BEFORE = "before"
