"""The Linformer's projections E_i, F_i ∈ R^{budget × n} of every (layer, head) under a sharing level.

Sharing levels (Wang et al. 2020, section 4): "none" (E_i, F_i per head: 2·L·H matrices), "headwise" (one
E and one F per layer: 2·L), "kv" (E = F per layer: L), "layerwise" (one matrix for all layers, heads,
keys and values: 1). "none" is eq. 7 as written; the reference implementation's default is "headwise".

The projected dimension is the budget k. Projection weights have shape (budget, max_len), as the reference
implementation's nn.Linear(max_len, k) weights; a sequence of m ≤ max_len tokens uses the first m columns.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np

import torch
from torch import nn

from ..config import Init, Sharing, check_budget, choose
from ..errors import SpectraError
from ..seeds import Domain, derive_seed, jl_matrix

#: (layer, head, which) after sharing: -1 marks an index shared across, which ∈ {"e", "f", "ef"}
Key = tuple[int, int, str]
_WHICH = {"e": 1, "f": 2, "ef": 3}


def projection_key(sharing: Sharing | str, layer: int, head: int, which: str) -> Key:
    """The distinct matrix that (layer, head, which ∈ {"e", "f"}) uses under `sharing`."""
    sharing = choose(Sharing, sharing, "sharing")
    if sharing == Sharing.NONE:
        return (layer, head, which)
    if sharing == Sharing.HEADWISE:
        return (layer, -1, which)
    if sharing == Sharing.KV:
        return (layer, -1, "ef")
    return (-1, -1, "ef")  # layerwise


def distinct_keys(sharing: Sharing | str, layers: int, heads: int) -> list[Key]:
    """Every distinct projection under `sharing`, in a fixed order (layer, head, e before f)."""
    keys: dict[Key, None] = {}
    for layer in range(layers):
        for head in range(heads):
            for which in ("e", "f"):
                keys[projection_key(sharing, layer, head, which)] = None
    return list(keys)


def jl_projection(key: Key, budget: int, max_len: int, seed: int = 0) -> torch.Tensor:
    """The seeded JL matrix N(0, 1/budget) of shape (budget, max_len) for one distinct key."""
    layer, head, which = key
    return jl_matrix(budget, max_len, derive_seed(seed, Domain.LINFORMER, budget, layer + 1, head + 1, _WHICH[which]))


def jl_pair(
    sharing: Sharing | str, layer: int, heads: int, budget: int, n: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """E and F (H, budget, n) of one layer, drawn exactly as `Projections(init="jl")` draws them.

    Draws only this layer's matrices, so a probe can evaluate eq. 7 layer by layer without holding
    every layer's projections.
    """
    check_budget(budget)
    drawn: dict[Key, torch.Tensor] = {}

    def get(head: int, which: str) -> torch.Tensor:
        key = projection_key(sharing, layer, head, which)
        if key not in drawn:
            drawn[key] = jl_projection(key, budget, n, seed)
        return drawn[key]

    e = torch.stack([get(head, "e") for head in range(heads)])
    f = torch.stack([get(head, "f") for head in range(heads)])
    return e, f


def _xavier(budget: int, max_len: int, seed: int) -> torch.Tensor:
    """The reference implementation's init of its nn.Linear(max_len, budget) compression weights:
    xavier_uniform_ with gain 1/√2, i.e. U(−a, a) with a = (1/√2)·√(6 / (max_len + budget))."""
    bound = math.sqrt(3.0 / (max_len + budget))
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(budget, max_len, generator=generator, dtype=torch.float64) * 2 - 1).mul(bound).float()


def _name(key: Key) -> str:
    layer, head, which = key
    return f"l{'x' if layer < 0 else layer}_h{'x' if head < 0 else head}_{which}"


class Projections(nn.Module):
    """E_i, F_i for every (layer, head) of a model under one sharing level; shared matrices are one parameter.

    Each distinct matrix has shape (budget, max_len). `init`: "jl" — seeded N(0, 1/budget) (the JL
    matrices of the paper's theory); "xavier" — the reference implementation's xavier_uniform_(gain 1/√2);
    or pass `weights` to load given matrices (a mapping from `keys` to tensors, or a tensor stacked in
    `keys` order, or one (budget, max_len) tensor when there is a single distinct matrix), kept in the
    floating dtype given (several dtypes: their common one; integers: float32). Drawn matrices are float32.
    `delta` applies Theorem 2's scaling E = δR, F = e^{−δ}R on top of the stored R (so "kv" and
    "layerwise" still store one R, used with two scale factors).
    """

    def __init__(
        self,
        layers: int,
        heads: int,
        budget: int,
        max_len: int,
        sharing: Sharing | str = Sharing.HEADWISE,
        *,
        init: Init | str = Init.JL,
        seed: int = 0,
        delta: float | None = None,
        weights: torch.Tensor | Mapping[Key, torch.Tensor] | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        sharing = choose(Sharing, sharing, "sharing")
        check_budget(budget, max_len, "max_len")
        if layers < 1 or heads < 1:
            raise SpectraError(f"layers and heads must be ≥ 1, got {layers} and {heads}")
        init = choose(Init, init, "init")
        if delta is not None and not delta >= 0:
            raise SpectraError(f"delta must be ≥ 0 (Theorem 2 uses a small positive constant), got {delta}")
        self.layers, self.heads, self.budget, self.max_len, self.sharing = layers, heads, budget, max_len, sharing
        self.e_scale = 1.0 if delta is None else float(delta)
        self.f_scale = 1.0 if delta is None else math.exp(-float(delta))
        self.keys = distinct_keys(sharing, layers, heads)
        given = self._given(weights) if weights is not None else None
        self.weights = nn.ParameterDict()
        for i, key in enumerate(self.keys):
            if given is not None:
                matrix = given[i]
            elif init == Init.JL:
                matrix = jl_projection(key, budget, max_len, seed)
            else:
                layer, head, which = key
                matrix = _xavier(budget, max_len, derive_seed(seed, Domain.LINFORMER_XAVIER, budget, layer + 1, head + 1, _WHICH[which]))
            self.weights[_name(key)] = nn.Parameter(matrix, requires_grad=trainable)

    def _given(self, weights: torch.Tensor | Mapping[Key, torch.Tensor]) -> list[torch.Tensor]:
        shape = (self.budget, self.max_len)
        if isinstance(weights, Mapping):
            missing = [key for key in self.keys if key not in weights]
            if missing:
                raise SpectraError(
                    f"weights lack the projections {missing[:3]}; sharing '{self.sharing}' needs keys {self.keys[:3]}…"
                )
            found = [torch.as_tensor(weights[key]) for key in self.keys]
        else:
            weights = torch.as_tensor(weights)
            found = [weights] if weights.dim() == 2 and len(self.keys) == 1 else list(weights)
            if weights.dim() != 3 and not (weights.dim() == 2 and len(self.keys) == 1) or len(found) != len(self.keys):
                raise SpectraError(
                    f"weights of shape {tuple(weights.shape)} do not fit sharing '{self.sharing}': "
                    f"expected ({len(self.keys)}, {self.budget}, {self.max_len})"
                )
        for matrix in found:
            if tuple(matrix.shape) != shape:
                raise SpectraError(f"a projection has shape {tuple(matrix.shape)}; expected (budget, max_len) = {shape}")
        dtype = found[0].dtype  # kept as given (float64 stays float64); mixed or integer weights are promoted
        for matrix in found[1:]:
            dtype = torch.promote_types(dtype, matrix.dtype)
        dtype = dtype if dtype.is_floating_point else torch.float32
        return [matrix.detach().clone().to(dtype) for matrix in found]

    @property
    def count(self) -> int:
        """Number of distinct projection matrices (2·L·H, 2·L, L or 1)."""
        return len(self.keys)

    def matrix(self, layer: int, head: int, which: str) -> torch.Tensor:
        """The stored R (budget, max_len) that E ("e") or F ("f") of (layer, head) is made of, unscaled."""
        if not (0 <= layer < self.layers and 0 <= head < self.heads and which in ("e", "f")):
            raise SpectraError(f"no projection ({layer}, {head}, {which!r}) in {self.layers} layers × {self.heads} heads")
        return self.weights[_name(projection_key(self.sharing, layer, head, which))]

    def pair(self, layer: int, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """E and F (H, budget, n) of one layer, scaled (Theorem 2's δ) and sliced to the first n columns."""
        n = self.max_len if n is None else n
        if n > self.max_len:
            raise SpectraError(
                f"a sequence of {n} tokens is longer than the projections' max_len {self.max_len}; "
                f"build Projections with max_len ≥ {n}"
            )
        e = torch.stack([self.matrix(layer, head, "e")[:, :n] for head in range(self.heads)])
        f = torch.stack([self.matrix(layer, head, "f")[:, :n] for head in range(self.heads)])
        return e * self.e_scale, f * self.f_scale


def projections_arrays(fitted: Mapping[tuple[str, int], "Projections"]) -> dict[str, np.ndarray]:
    """Projections by (name, budget) as plain arrays for an .npz file (no pickle): per entry its distinct matrices
    stacked in `keys` order, the keys, its shape and sharing, and its E/F scales."""
    arrays: dict[str, np.ndarray] = {}
    for (name, budget), projections in fitted.items():
        prefix = f"{name}|{budget}|"
        arrays[prefix + "weights"] = torch.stack([projections.weights[_name(key)].detach().cpu()
                                                  for key in projections.keys]).numpy()
        arrays[prefix + "keys"] = np.array([[layer, head, _WHICH[which]] for layer, head, which in projections.keys])
        arrays[prefix + "shape"] = np.array([projections.layers, projections.heads, projections.budget,
                                             projections.max_len])
        arrays[prefix + "sharing"] = np.array(str(projections.sharing))
        arrays[prefix + "scales"] = np.array([projections.e_scale, projections.f_scale])
    return arrays


def projections_from_arrays(arrays: Mapping[str, np.ndarray]) -> dict[tuple[str, int], "Projections"]:
    """The inverse of `projections_arrays`: every entry "<name>|<budget>|…" in `arrays` (others, such as another
    method's fitted parameters in the same file, are left alone)."""
    entries = sorted({key.rsplit("|", 1)[0] for key in arrays if key.endswith("|shape") and key.count("|") == 2})
    found = {}
    for entry in entries:
        name, budget_text = entry.rsplit("|", 1)
        layers, heads, budget, max_len = (int(x) for x in arrays[f"{entry}|shape"])
        weights = torch.from_numpy(np.asarray(arrays[f"{entry}|weights"]).copy())
        projections = Projections(layers, heads, budget, max_len, str(arrays[f"{entry}|sharing"]), weights=weights,
                                  trainable=False)
        projections.e_scale, projections.f_scale = (float(x) for x in arrays[f"{entry}|scales"])
        found[(name, int(budget_text))] = projections
    return found


def load_projections(source: str | Path, name: str, budget: int) -> "Projections":
    """Projections saved by a run (`<run>/projections.npz`, or that file itself) for method `name` at `budget`:
    ready for `LinformerSelfAttention`, `linformer.substitute` or your own experiment."""
    path = Path(source)
    path = path / "projections.npz" if path.is_dir() else path
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError) as error:
        raise SpectraError(f"{path} holds no projections spectra can read ({str(error).splitlines()[0]})") from None
    fitted = projections_from_arrays(arrays)
    if (name, budget) not in fitted:
        available = ", ".join(f"{n} at k = {k}" for n, k in sorted(fitted))
        raise SpectraError(f"{path} has no projections for {name} at k = {budget}; it has {available or 'none'}")
    return fitted[(name, budget)]
