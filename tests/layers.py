"""Shared helpers of the method and probe tests: random captured layers with padding, and the dense
references they are checked against (numpy softmax, eager attention's formula, transformers' padding mask)."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import torch

from spectra.reporter import QUIET
from spectra.capture import Captured
from spectra.methods import REGISTRY, Approximation, Draws, Layer, Method, resolve
from spectra.spectrum import masked

B, H, N, D = 2, 3, 12, 4


def padding_mask(lengths: Sequence[int], n: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive (B, 1, n, n) key-padding mask of sequences of the given lengths, as transformers builds it."""
    valid = torch.arange(n)[None, :] < torch.tensor(list(lengths))[:, None]
    mask = torch.zeros(len(lengths), 1, n, n, dtype=dtype)
    return mask.masked_fill(~valid[:, None, None, :], torch.finfo(dtype).min)


def attention_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None,
                    scaling: float | None = None) -> torch.Tensor:
    """P = softmax(q kᵀ · scaling + mask), eager attention's formula (scaling defaults to 1/√d)."""
    scaling = q.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    return torch.softmax(scores if mask is None else scores + mask, dim=-1)


def captured(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int] | None = None,
             scaling: float | None = None, layer: int = 3, index: Sequence[int] | None = None) -> Captured:
    """A captured layer of the given tensors; `lengths` pads each sequence after its length; `index`: the
    sequences' global indices (default 0…B−1, a run's first batch)."""
    mask = None if lengths is None else padding_mask(lengths, q.shape[-2], dtype=q.dtype)
    return Captured.of(layer, q, k, v, mask, scaling, index=tuple(range(q.shape[0]) if index is None else index))


@functools.lru_cache(maxsize=None)
def stand_in_fits(n: int = N, heads: int = H, layer: int = 3, d: int = D) -> dict[str, Method]:
    """A fitted instance of every calibrating method, so registry-wide tests can run them: each fitted by its own
    `fit` with no descent step (steps = 0: a method's start — mean pooling for linformer-fit, the principal
    directions for linformer-pca, uniform pooling and the least-squares output transform for fastformer-fit) on
    a small Gaussian calibration of `layer` (the one the test layers have), at every budget 1…n; made once, on
    first use."""
    from spectra.nn.calibration import Calibration
    from spectra.nn.descent import FitSettings

    g = torch.Generator().manual_seed(123)
    lengths = torch.tensor([n, n, n - 3, n])
    valid = torch.arange(n)[None, :] < lengths[:, None]
    calibrations = [Calibration(layer, *(torch.randn(len(lengths), heads, n, d, generator=g, dtype=torch.float64)
                                         for _ in range(3)), valid, 0.7)]
    settings = FitSettings(budgets=tuple(range(1, n + 1)), steps=0)
    fits = {}
    for label, method in REGISTRY.items():
        if method.calibrates:
            fits[label] = method.fresh()
            fits[label].fit(calibrations, layers=layer + 1, heads=heads, n=n, settings=settings,
                            reporter=QUIET)
    return fits


def method(name: str, fitted: dict | None = None) -> Method:
    """The registered method `name`, for a calibrating one its stand-in fit (`stand_in_fits()`, or the instances
    `fitted`)."""
    if fitted is None and REGISTRY[name].calibrates:
        fitted = stand_in_fits()
    return resolve(name, fitted)


def draws(x: Layer, *, seed: int = 0, fixed: bool = True, projection: str = "gaussian",
          index: Sequence[int] | None = None) -> Draws:
    """Draws for the batch of x: one for the whole run by default (`fixed`), the sequences' global indices 0…B−1
    unless given."""
    return Draws(seed, tuple(range(x.q.shape[0])) if index is None else tuple(index), fixed, projection)


def approximate(name: str, x: Layer, budget: int, given: Draws | None = None, fitted: dict | None = None
                ) -> Approximation:
    """Method `name` (its stand-in fit if it calibrates) on x at `budget`, with `given` draws (default: `draws(x)`)."""
    return method(name, fitted)(x, budget, draws(x) if given is None else given)


def random_layer(lengths: Sequence[int] = (N, N), *, n: int = N, seed: int = 0, spread: float = 1.0,
                 scaling: float = 0.7, use_p: bool = True) -> Layer:
    """A float64 Layer of Gaussian q, k, v (B = len(lengths), H heads, n tokens, D dims), padded after `lengths`."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(len(lengths), H, n, D, generator=g, dtype=torch.float64) * spread for _ in range(3))
    return Layer.of(captured(q, k, v, lengths, scaling), use_p=use_p)


def with_lengths(q, k, v, lengths, scaling: float = 0.7) -> Layer:
    return Layer.of(captured(q, k, v, lengths, scaling), use_p=False)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def head(x: Layer, b: int, h: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of one sequence's head, its m valid rows, as numpy arrays."""
    return tuple(t[b, h, :m].numpy() for t in (x.q, x.k, x.v))


def dense_p(x: Layer, b: int, h: int, m: int) -> np.ndarray:
    """P of one head's valid block, recomputed in numpy."""
    q, k, _ = head(x, b, h, m)
    return softmax(q @ k.T * x.scaling)


def exact_on_valid_rows(x: Layer, approximation, atol: float) -> bool:
    """P̃ = P and Ṽ = P V on the valid rows (padded rows are never measured)."""
    rows = x.valid[:, None, :, None].to(x.p.dtype)
    return (torch.allclose(masked(approximation.p, x.valid), x.p, atol=atol)
            and torch.allclose(approximation.out * rows, x.p @ x.v, atol=atol))


#: a rounding-level relative change of float32 data: one unit in the last place of a number in [1, 2)
ULP32 = 2.0**-23


def float32_qkv(lengths: Sequence[int], *, n: int, d: int, seed: int = 0, spread: float = 1.0,
                perturbation: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gaussian float32 q, k, v (B = len(lengths), H heads, n, d), as a model captures them; with `perturbation`,
    every entry multiplied by (1 + u·2⁻²³), u ~ U(−1, 1) seeded by it: what another machine's rounding does."""
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(len(lengths), H, n, d, generator=g) * spread for _ in range(3)]
    if perturbation is not None:
        g = torch.Generator().manual_seed(10_000 + perturbation)
        qkv = [t * (1 + (torch.rand(t.shape, generator=g) * 2 - 1) * ULP32) for t in qkv]
    return qkv[0], qkv[1], qkv[2]


def rounding_sensitivity(run, lengths: Sequence[int], budget: int, *, n: int, d: int, seed: int, spread: float,
                         scaling: float, perturbations: int = 4) -> float:
    """The largest relative change ‖Ṽ' − Ṽ‖_F/‖Ṽ‖_F over heads and `perturbations` rounding-level perturbations of
    float32 q, k, v (`float32_qkv`) of a method `run(layer, budget, draws)` (fixed draws, seed 0)."""
    def out(perturbation: int | None) -> torch.Tensor:
        q, k, v = float32_qkv(lengths, n=n, d=d, seed=seed, spread=spread, perturbation=perturbation)
        x = Layer.of(captured(q, k, v, lengths, scaling), use_p=False)
        return run(x, budget, draws(x)).out.to(torch.float64) * x.valid[:, None, :, None]

    base = out(None)
    changes = [(out(i) - base).flatten(-2).norm(dim=-1) / base.flatten(-2).norm(dim=-1)
               for i in range(perturbations)]
    return torch.stack(changes).max().item()
