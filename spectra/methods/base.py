"""What every approximation method shares: the layer it sees, what it returns, and the registry.

A method is a plain function `(Layer, budget) -> Approximation`, registered with its label, plot style,
terminal header and whether it respects causality. `Layer` is a captured layer in float32 or better with
padding already taken care of: padded keys never contribute (their value rows are zero and P's padded
rows and columns are zero) and padded query rows are ignored by the measures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..capture import Captured, Substitute
from ..config import Projection
from ..errors import InternalError, SpectraError
from ..seeds import Domain, derive_seed, jl_matrix, orthogonal_matrix
from ..spectrum import masked, split_threads


@dataclass
class Layer:
    """One layer's captured attention in float32 or better: q, k, v (B, H, n, d), valid keys (B, n), and
    P with padded rows and columns zeroed (B, H, n, n) — formed only when a method or measure asks.

    Random methods (jl, linformer, performer, skyformer's landmarks, probsparse's key samples) draw from
    `seed`: unless `fixed`, each sequence draws its own, seeded by its global index in `index`, so a method's
    error is measured over the randomness it is made of and does not depend on the batching; `fixed` keeps
    one draw per (budget, layer, head) for the whole run. Drawing per sequence needs `index`: a layer with
    `fixed=False` and no index is a bug and raises (never a silent fall back to fixed draws). `fitted`
    holds projections fitted on calibration sequences, by (method label, budget)."""

    layer: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor
    scaling: float
    seed: int = 0
    projection: Projection = Projection.GAUSSIAN
    causal: bool = False
    index: tuple[int, ...] | None = None
    fixed: bool = True
    fitted: Mapping[tuple[str, int], Any] | None = field(default=None, repr=False)
    _p: torch.Tensor | None = field(default=None, repr=False)
    _svd: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.fixed:
            return
        if self.index is None:
            raise InternalError(f"layer {self.layer}: per-sequence draws (fixed=False) need the sequences' global "
                                "indices, and none were given")
        if len(self.index) != self.q.shape[0]:
            raise InternalError(f"layer {self.layer}: {len(self.index)} sequence indices for a batch of "
                                f"{self.q.shape[0]} sequences")

    @classmethod
    def of(cls, captured: Captured, *, use_p: bool = True, seed: int = 0,
           projection: Projection = Projection.GAUSSIAN, fixed: bool = True,
           fitted: Mapping[tuple[str, int], Any] | None = None) -> Layer:
        """From a captured layer (any dtype; promoted to float32 or better). With `use_p` the capture's P is
        used; without, P is computed from q and k on first use, so a substitution that never needs it skips it.
        Per-sequence draws (`fixed=False`) read the record's indices, which must be there."""
        dtype = torch.promote_types(captured.q.dtype, torch.float32)
        q, k, v = captured.q.to(dtype), captured.k.to(dtype), captured.v.to(dtype)
        valid = captured.valid
        v = v * valid[:, None, :, None].to(dtype)
        given = masked(captured.p.to(dtype), valid) if use_p else None
        index = captured.index if fixed else tuple(captured.sequence_index())
        return cls(captured.layer, q, k, v, valid, captured.scaling, seed, Projection(projection), captured.causal,
                   index, fixed, fitted, _p=given)

    @property
    def per_sequence(self) -> bool:
        """Whether each sequence draws its own random projections (not `fixed`; the index is then there)."""
        return not self.fixed

    def sequence_seeds(self, *parts: int) -> list[int]:
        """One seed per sequence for a draw identified by `parts` (the same seed for all when not per sequence)."""
        if not self.per_sequence:
            return [derive_seed(self.seed, *parts)] * self.q.shape[0]
        return [derive_seed(self.seed, *parts, sequence) for sequence in self.index]

    @property
    def allowed(self) -> torch.Tensor:
        """Which keys each query may see (B, 1, n, n): the valid ones, and for causal attention those at or
        before the query's position."""
        allowed = self.valid[:, None, None, :]
        if self.causal:
            n = self.q.shape[-2]
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=self.q.device).tril()
        return allowed

    @property
    def p(self) -> torch.Tensor:
        if self._p is None:
            scores = (self.q @ self.k.transpose(-1, -2)) * self.scaling
            allowed = self.allowed
            p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            p = torch.where(allowed.any(-1, keepdim=True), p, 0.0)  # a left-padded query sees no key: zero row
            self._p = masked(p, self.valid)
        return self._p

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """U, σ, Vᵀ of P, computed once per layer for every budget."""
        if self._svd is None:
            parts = split_threads(lambda p: torch.linalg.svd(p, full_matrices=False), self.p)
            self._svd = tuple(torch.cat(factor).reshape(*self.p.shape[:-2], *factor[0].shape[1:])
                              for factor in zip(*parts))
        return self._svd

    def sequences(self) -> list[Layer]:
        """The batch as layers of one sequence each (for methods that draw per sequence one at a time)."""
        parts = []
        for b in range(self.q.shape[0]):
            one = slice(b, b + 1)
            parts.append(replace(self, q=self.q[one], k=self.k[one], v=self.v[one], valid=self.valid[one],
                                 index=None if self.index is None else self.index[one],
                                 _p=None if self._p is None else self._p[one], _svd=None))
        return parts

    def random(self, budget: int, which: int = 0) -> torch.Tensor:
        """A seeded projection R per head: Gaussian N(0, 1/k) or scaled orthonormal rows; (H, k_proj, n), or
        (B, H, k_proj, n) when each sequence draws its own."""
        heads, n = self.q.shape[1], self.q.shape[-2]
        draw = jl_matrix if self.projection == Projection.GAUSSIAN else orthogonal_matrix

        def drawn(*extra: int) -> torch.Tensor:
            return torch.stack([draw(budget, n, derive_seed(self.seed, Domain.JL_METHOD, budget, self.layer, head,
                                                            which, *extra), device=self.q.device, dtype=self.q.dtype)
                                for head in range(heads)])

        if not self.per_sequence:
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


Method = Callable[[Layer, int], Approximation]


@dataclass(frozen=True)
class Entry:
    """A registered method: its function and how it is shown (plot colour and marker, terminal header)."""

    label: str
    run: Method
    family: str
    color: str
    marker: str
    short: str
    causal: bool = False
    calibrates: bool = False


#: label → entry, in registration order
REGISTRY: dict[str, Entry] = {}


def register(label: str, run: Method, *, color: str, marker: str, family: str | None = None,
             short: str | None = None, causal: bool = False, calibrates: bool = False) -> Method:
    """Register `run` under `label`; `family` (default the label) is what `--methods` may name for all of its
    variants; `short` is the terminal column header (default: the label)."""
    if label in REGISTRY:
        raise ValueError(f"method '{label}' is registered twice")
    REGISTRY[label] = Entry(label, run, family or label, color, marker, short or label, causal, calibrates)
    return run


def method(label: str, **shown) -> Callable[[Method], Method]:
    """Decorator form of `register`."""

    def decorate(run: Method) -> Method:
        return register(label, run, **shown)

    return decorate


def expand(names: Iterable[str]) -> list[str]:
    """Method labels from user names: a label, or a family meaning all its variants (`linformer`: four)."""
    labels: list[str] = []
    for name in names:
        name = name.strip()
        found = [label for label, entry in REGISTRY.items() if name in (label, entry.family)]
        if not found:
            valid = sorted({entry.family for entry in REGISTRY.values()} | set(REGISTRY))
            raise SpectraError(f"unknown method '{name}'; valid methods: {', '.join(valid)}")
        labels += [label for label in found if label not in labels]
    if not labels:
        raise SpectraError("no method given; pass e.g. --methods svd,jl,linformer,pool-mean")
    return labels


def substitute(label: str, budget: int | Callable[[int], int], layers: Iterable[int] | None, *, seed: int = 0,
               projection: Projection = Projection.GAUSSIAN, fixed: bool = True,
               fitted: Mapping[tuple[str, int], Any] | None = None) -> Substitute:
    """A capture substitution computing `label` at `budget` (a number, or a layer's budget from a function of
    the layer, e.g. a k plan) in `layers` (all when None)."""
    approximate = REGISTRY[label].run
    chosen = None if layers is None else set(layers)

    def run(captured: Captured) -> torch.Tensor | None:
        if chosen is not None and captured.layer not in chosen:
            return None
        x = Layer.of(captured, use_p=False, seed=seed, projection=projection, fixed=fixed, fitted=fitted)
        at = budget(captured.layer) if callable(budget) else budget
        return approximate(x, at).out.to(captured.q.dtype)

    return run


def valid_first(valid: torch.Tensor) -> torch.Tensor:
    """Positions (B, n) with the valid ones first, in order: rank r ↦ the r-th valid position."""
    return torch.argsort((~valid).int(), dim=-1, stable=True)
