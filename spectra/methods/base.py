"""What every approximation method shares: the layer it sees, the randomness it draws, what it returns, the
`Method` class each family subclasses, and the registry.

A method is an object: its label, family, plot colour and marker and terminal header, what it is — `causal`
(on a decoder's layer a query's output never depends on a later position), `random` (made of random draws,
taken from `Draws` only), `calibrates` (fitted on calibration sequences before it is measured, `Calibrated`) —
and `approximate(x, budget, draws)`. `Layer` holds only one layer's tensors, in float32 or better with padding
taken care of: padded keys never contribute (their value rows are zero and P's padded rows and columns are
zero) and padded query rows are ignored by the measures. `Draws` holds a batch's randomness: the run's seed,
the sequences' global indices, whether one draw serves the whole run, and the random projection's distribution.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np
import pandas as pd
import torch

from ..capture import Captured, Substitute
from ..config import Projection
from ..errors import InternalError, SpectraError, spell
from ..reporter import Reporter
from ..kernels import allowed, masked_softmax, scores
from ..registry import METHODS, Registry
from ..seeds import Domain, derive_seed, jl_matrix, orthogonal_matrix
from ..spectrum import masked, split_threads

if TYPE_CHECKING:
    from ..nn.calibration import Calibration
    from ..nn.fit import FitSettings


@dataclass
class Layer:
    """One layer's captured attention in float32 or better: q, k, v (B, H, n, d), valid keys (B, n), the score
    scale, whether attention is causal, and P with padded rows and columns zeroed (B, H, n, n) — formed only when
    a method or measure asks — with its SVD."""

    layer: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor
    scaling: float
    causal: bool = False
    _p: torch.Tensor | None = field(default=None, repr=False)
    _svd: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, captured: Captured, *, use_p: bool = True) -> "Layer":
        """From a captured layer (any dtype; promoted to float32 or better). With `use_p` the capture's P is
        used; without, P is computed from q and k on first use, so a substitution that never needs it skips it."""
        dtype = torch.promote_types(captured.q.dtype, torch.float32)
        q, k, v = captured.q.to(dtype), captured.k.to(dtype), captured.v.to(dtype)
        valid = captured.valid
        v = v * valid[:, None, :, None].to(dtype)
        given = masked(captured.p.to(dtype), valid) if use_p else None
        return cls(captured.layer, q, k, v, valid, captured.scaling, captured.causal, _p=given)

    @property
    def allowed(self) -> torch.Tensor:
        """Which keys each query may see (B, 1, 1|n, n): the valid ones, and for causal attention those at or
        before the query's position."""
        return allowed(self.valid, self.causal)

    @property
    def p(self) -> torch.Tensor:
        if self._p is None:
            self._p = masked(masked_softmax(scores(self.q, self.k, self.scaling), self.allowed), self.valid)
        return self._p

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """U, σ, Vᵀ of P, computed once per layer for every budget."""
        if self._svd is None:
            parts = split_threads(lambda p: torch.linalg.svd(p, full_matrices=False), self.p)
            self._svd = tuple(torch.cat(factor).reshape(*self.p.shape[:-2], *factor[0].shape[1:])
                              for factor in zip(*parts))
        return self._svd

    def sequence(self, b: int) -> "Layer":
        """Sequence b of the batch as a layer of its own."""
        one = slice(b, b + 1)
        return replace(self, q=self.q[one], k=self.k[one], v=self.v[one], valid=self.valid[one],
                       _p=None if self._p is None else self._p[one], _svd=None)


@dataclass(frozen=True)
class Draws:
    """The randomness of one batch: the run's `seed`, each sequence's global `index` in the run, `fixed` (one
    draw per (budget, layer, head) for the whole run, `--fixed-projection`) and the `projection` distribution.

    Unless `fixed`, each sequence draws its own, seeded by its global index, so a method's error is measured over
    the randomness it is made of and depends neither on the batching nor on the number of processes. The indices
    are required: a batch without them is a bug and raises, never a silent fall back to batch positions."""

    seed: int
    index: tuple[int, ...]
    fixed: bool = False
    projection: Projection = Projection.GAUSSIAN

    def __post_init__(self) -> None:
        if self.index is None:
            raise InternalError("a batch's draws need the sequences' global indices, and none were given")
        object.__setattr__(self, "index", tuple(int(i) for i in self.index))
        object.__setattr__(self, "projection", Projection(self.projection))

    @classmethod
    def of(cls, captured: Captured, *, seed: int = 0, projection: Projection | str = Projection.GAUSSIAN,
           fixed: bool = False) -> "Draws":
        """The draws of a captured batch: its record's indices, which must be there."""
        return cls(seed, tuple(captured.sequence_index()), fixed, Projection(projection))

    @property
    def per_sequence(self) -> bool:
        """Whether each sequence draws its own randomness (not `fixed`)."""
        return not self.fixed

    def seeds(self, *parts: int) -> list[int]:
        """One seed per sequence for a draw identified by `parts` (the same seed for all when fixed)."""
        if self.fixed:
            return [derive_seed(self.seed, *parts)] * len(self.index)
        return [derive_seed(self.seed, *parts, sequence) for sequence in self.index]

    def sequence(self, b: int) -> "Draws":
        """The draws of sequence b of the batch alone."""
        return replace(self, index=self.index[b:b + 1])

    def matrix(self, x: Layer, budget: int, which: int = 0) -> torch.Tensor:
        """A seeded projection R per head of layer x: Gaussian N(0, 1/budget) or scaled orthonormal rows;
        (H, budget, n), or (B, H, budget, n) when each sequence draws its own."""
        heads, n = x.q.shape[1], x.q.shape[-2]
        draw = jl_matrix if self.projection == Projection.GAUSSIAN else orthogonal_matrix

        def drawn(*extra: int) -> torch.Tensor:
            return torch.stack([draw(budget, n, derive_seed(self.seed, Domain.JL_METHOD, budget, x.layer, head,
                                                            which, *extra), device=x.q.device, dtype=x.q.dtype)
                                for head in range(heads)])

        if self.fixed:
            return drawn()
        return torch.stack([drawn(sequence) for sequence in self.index])


@dataclass
class Approximation:
    out: torch.Tensor  # (B, H, n, d)
    p: torch.Tensor | None  # (B, H, n, n) or None


def joined(parts: list[Approximation]) -> Approximation:
    """Approximations of consecutive sequences as one batch."""
    return Approximation(torch.cat([part.out for part in parts]),
                         None if parts[0].p is None else torch.cat([part.p for part in parts]))


class Method:
    """An approximation method: `approximate(x, budget, draws)` for one layer's batch, and what it is.

    A subclass declares, as literals in its class body (the registry reads them from the source, without torch),
    its `family` (what `--methods` may name for all its variants), whether it is `causal`, `random` or
    `calibrates`, and its `variants`: each label it is registered under and the keyword arguments of that instance
    — a parameter (a sharing level, an iteration count; one named as a fact, `causal`, sets it for that variant),
    its plot colour and marker and terminal header `short`. An unregistered variant of your own
    (`Nystrom("nystrom-iter60", 60)`) needs no style. Call a method as `method(x, budget, draws)`: it checks the
    draws fit the batch."""

    family: str = ""
    causal: bool = False
    random: bool = False
    calibrates: bool = False
    #: label → keyword arguments of its instance (`cls(label, **arguments)`), one registered variant each
    variants: dict[str, dict[str, object]] = {}

    def __init__(self, label: str, *, color: str = "gray", marker: str = ".", short: str | None = None,
                 family: str | None = None) -> None:
        self.label, self.color, self.marker, self.short = label, color, marker, short or label
        self.family = family or type(self).family or label

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        raise NotImplementedError

    def __call__(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        if len(draws.index) != x.q.shape[0]:
            raise InternalError(f"layer {x.layer}: {len(draws.index)} sequence indices for a batch of "
                                f"{x.q.shape[0]} sequences")
        return self.approximate(x, budget, draws)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label!r})"


def one_by_one(method: Method, x: Layer, budget: int, draws: Draws) -> Approximation:
    """`method` on each sequence of the batch alone, joined (for methods whose draws are made a sequence at a
    time)."""
    return joined([method.approximate(x.sequence(b), budget, draws.sequence(b)) for b in range(x.q.shape[0])])


class Calibrated(Method):
    """A method fitted on calibration sequences before it is measured (`spectra approx --fit-samples N`).

    The registry holds an unfitted instance of each variant; a run fits its own `fresh()` copy, so its fitted
    parameters live on that instance and two runs in one process never share them. `fit` fits every budget the
    run measures; `arrays` / `load_arrays` carry the fitted parameters to checkpoints and `projections.npz`
    (every key begins with the label and "|"). `approximate` on an unfitted instance says how to fit it."""

    calibrates = True

    def fresh(self) -> "Calibrated":
        """A new unfitted instance of this variant."""
        made = copy.copy(self)
        made.reset()
        return made

    def reset(self) -> None:
        """Forget every fitted parameter."""
        raise NotImplementedError

    @property
    def fitted(self) -> bool:
        raise NotImplementedError

    def fit(self, calibrations: Sequence["Calibration"], *, layers: int, heads: int, n: int,
            settings: "FitSettings", reporter: Reporter) -> pd.DataFrame:
        """Fit on the calibrations (one per layer) for a model of `layers` × `heads` at length n; returns the fit's
        history (one row per step and fitted group, empty for a closed form) and reports through `reporter`."""
        raise NotImplementedError

    def arrays(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        raise NotImplementedError

    def unfitted(self, budget: int | None = None) -> SpectraError:
        """The error of a method asked before its fit: how to fit it."""
        at = "" if budget is None else f" at k = {budget}"
        return SpectraError(f"{self.label}{at} needs projections fitted on calibration sequences: pass "
                            f"{spell('--fit-samples N', 'fit_samples=N')} to "
                            f"{spell('spectra approx', 'spectra.approx')}")


#: label → method, listed from the method classes' source (`spectra.registry`), the file imported on first use
REGISTRY: Registry[Method] = METHODS

MethodClass = TypeVar("MethodClass", bound=type[Method])


def register(cls: MethodClass) -> MethodClass:
    """Register a method class (a class decorator): one instance per `variants` entry, `cls(label, **arguments)`,
    under its label, with the facts the class declares."""
    for label, arguments in vars(cls).get("variants", {}).items():
        method = cls(label, **arguments)
        REGISTRY.add(label, method, family=method.family, causal=method.causal, calibrates=method.calibrates)
    return cls


def resolve(method: Method | str, fitted: Mapping[str, Method] | None = None) -> Method:
    """A method itself, or by label: the run's fitted instance in `fitted` when it has one, else the registry's."""
    if isinstance(method, Method):
        return method
    return (fitted or {}).get(method) or REGISTRY[method]


def substitute(method: Method | str, budget: int | Callable[[int], int], layers: Iterable[int] | None, *,
               seed: int = 0, projection: Projection | str = Projection.GAUSSIAN, fixed: bool = False,
               fitted: Mapping[str, Any] | None = None) -> Substitute:
    """A capture substitution computing `method` (or the label of one, the run's fitted instance taken from
    `fitted`) at `budget` — a number, or a layer's budget from a function of the layer (a k plan) — in `layers`
    (all when None), with the draws of each captured batch seeded by its records' sequence indices."""
    approximate = resolve(method, fitted)
    chosen = None if layers is None else set(layers)

    def run(captured: Captured) -> torch.Tensor | None:
        if chosen is not None and captured.layer not in chosen:
            return None
        x = Layer.of(captured, use_p=False)
        draws = Draws.of(captured, seed=seed, projection=projection, fixed=fixed)
        layer_budget = budget(captured.layer) if callable(budget) else budget
        return approximate(x, layer_budget, draws).out.to(captured.q.dtype)

    return run


def valid_first(valid: torch.Tensor) -> torch.Tensor:
    """Positions (B, n) with the valid ones first, in order: rank r ↦ the r-th valid position."""
    return torch.argsort((~valid).int(), dim=-1, stable=True)
