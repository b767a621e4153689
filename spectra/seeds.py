"""Where randomness enters: seeds derived from (seed, domain, …) and the random matrices drawn from them.

Every random draw in spectra is seeded by `derive_seed(seed, Domain.X, *parts)` with parts such as the
budget, layer, head or the sequence's global index, so no draw depends on batching or the number of
processes (results may still differ between batch sizes by floating-point rounding), and two domains never
share a stream. The domain numbers are part of every recorded
result: changing one changes the numbers of past runs.
"""

from __future__ import annotations

import enum
import math

from typing import TYPE_CHECKING

import numpy as np

from .config import check_budget
from .errors import SpectraError

if TYPE_CHECKING:  # torch loads with the first matrix drawn: deriving a seed (e.g. before a model loads) needs numpy only
    import torch


class Domain(enum.IntEnum):
    """One seed domain per use of randomness."""

    LINFORMER = 101  # Projections(init="jl") and linformer.jl_pair: E, F per distinct key
    LINFORMER_XAVIER = 102  # Projections(init="xavier")
    LINFORMER_FIT = 103  # nn.fit: the held-out validation split of the calibration sequences
    THEOREM1 = 201  # Theorem 1's R per (layer, budget)
    THEOREM2 = 202  # Theorem 2's R per (layer, budget)
    SYNTHETIC = 301  # Gaussian q, k, v
    JL_METHOD = 401  # the jl method's R (and orthogonal E, F) per (budget, layer, head[, sequence])
    MASK = 501  # end to end: the masked-LM masking of sequence i
    PERFORMER = 601  # FAVOR+ random features per (budget, layer, head[, sequence])
    SKYFORMER = 602  # landmark samples per (budget, layer, head, m[, sequence])
    PROBSPARSE = 603  # ProbSparse key samples per (layer, head, draw), or per (layer, head, sequence)
    BOOTSTRAP = 701  # Poisson bootstrap weights of sequence i
    INDUCTION = 801  # spectra heads: the random tokens of the induction sequences
    RANDOM_PRESS = 901  # spectra cache: the random press's scores of sequence i (one torch generator per layer)
    LEVERAGE_SKETCH = 902  # spectra cache: leverage's and compactor's Gaussian sketches of sequence i (one generator,
    # layer by layer; kvpress's CompactorPress draws them through its LeverageScorePress)
    CAM_MERGE = 903  # spectra cache: cam(…)'s Bernoulli merge draws of sequence i (one generator, layer by layer)
    TASKS = 1001  # spectra tasks: the draws of one example per (task number, length, sample)
    TASK_SAMPLES = 1002  # spectra cache --samples on a task file: the records it takes, spread over tasks and lengths


def derive_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed determined by (seed, *parts), independent across different parts."""
    if any(part < 0 for part in (seed, *parts)):
        raise SpectraError(f"seeds must be non-negative integers, got {seed} with parts {parts}")
    return int(np.random.SeedSequence([seed, *parts]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def jl_matrix(
    budget: int, n: int, seed: int = 0, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """R (budget, n) with i.i.d. N(0, 1/budget) entries; jl_matrix(k, n)[:, :m] == jl_matrix(k, m).

    Drawn column by column with numpy's PCG64, so the first m columns of an n-column draw equal the
    m-column draw (the paper's slicing rule costs nothing), and the numbers are the same on any device.
    """
    check_budget(budget)
    if n < 1:
        raise SpectraError(f"n must be ≥ 1, got {n}")
    import torch

    columns = np.random.default_rng(seed).standard_normal((n, budget))  # column j of R is row j
    return torch.from_numpy(columns.T / math.sqrt(budget)).to(device=device, dtype=dtype or torch.float32)


def orthogonal_matrix(
    budget: int, n: int, seed: int = 0, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """R (budget, n) with orthonormal rows scaled by √(n/budget): E[RᵀR] = I, and RᵀR = I when budget = n."""
    check_budget(budget, n, "n (orthonormal rows need budget ≤ n)")
    gaussian = np.random.default_rng(seed).standard_normal((n, budget))
    basis, upper = np.linalg.qr(gaussian)
    basis = basis * np.sign(np.diag(upper))  # Haar-distributed columns
    import torch

    return torch.from_numpy(basis.T * math.sqrt(n / budget)).to(device=device, dtype=dtype or torch.float32)
