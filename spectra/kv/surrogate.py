"""KVzap's surrogate (arXiv:2601.07891) fitted for any decoder: per layer, a map from each token's hidden state to
the log of KVzip's score of its cached pair, one output per key/value head.

KVzap's recipe is KVzip's scores as the target, a tiny model per layer as the fit; nothing else is trained:

- *data*: each calibration block of token ids is prefilled exactly (`kv.prefill.exact`, keeping every layer's
  attention input, `Prefill.read("hidden")` (L, D): the hidden states after the layer's input norm, what kvpress's KVzapPress
  reads) and KVzip's reconstruction pass scores its cached pairs (`kv.reconstruction.scores`, what the `kvzip` press
  ranks: per key/value head, the largest weight any repeat query of its group gives the pair). Rows are the positions
  KVzip scores: the first SINKS, whose score KVzip raises above every other (it never evicts them, and a surrogate
  fitted without them learns nothing of the attention sink: on SmolLM2 it evicted position 0 from a third of the
  heads of the first two layers), and those from the template's opening on; the opening's other positions, which
  KVzip leaves at 0 unmeasured, are left out;
- *target*: log(max(s, FLOOR)), the paper's regression target (the scores span orders of magnitude);
- *linear* (`ridge`): per layer, closed-form ridge least squares in float64 with an unpenalised intercept: X and y
  centred, W = (XcᵀXc + λI)⁻¹ Xcᵀyc with λ = RIDGE · tr(XcᵀXc) / D (relative, so it does not depend on the hidden
  states' scale), b = ȳ − W x̄;
- *mlp* (`mlp`): per layer, Linear(D, WIDTH)–GELU–Linear(WIDTH, H_kv) on standardised inputs and targets, STEPS
  full-batch Adam steps (learning rate RATE) on the mean squared error + DECAY · (‖W₀‖² + ‖W₂‖²) from a seeded
  initialisation (deterministic on one machine), the standardisation then folded into the two linears, so the
  artifact is kvpress's plain module. The weight penalty matters: without it, on a few thousand calibration tokens
  the MLP fits its own blocks (R² 0.97 on SmolLM2) and predicts held-out text worse than the linear map (0.34 against
  0.60; `benchmarks/kvzap_fit.py`).

`quality` says how well a surrogate predicts held-out scores: per layer and key/value head, R² of the log-scores and
the Spearman correlation of predicted and KVzip scores (eviction only needs the order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from . import prefill, reconstruction
from .presses.kvzap import surrogate_scores

#: relative ridge: λ = RIDGE · tr(XcᵀXc) / D
RIDGE = 1e-3
#: the smallest score whose log is taken (a weight that underflowed to 0 in float32)
FLOOR = 1e-30
#: the MLP's hidden units, full-batch Adam steps, learning rate, weight penalty (on the standardised scale)
WIDTH, STEPS, RATE, DECAY = 64, 300, 1e-2, 3e-2
#: `--surrogate`' choices: kvpress's model_type
KINDS = ("linear", "mlp")


def targets(scores: torch.Tensor) -> torch.Tensor:
    """The regression target of KVzip scores: log(max(s, FLOOR)), in float64."""
    return scores.double().clamp_min(FLOOR).log()


def scored_rows(length: int, prefix: int) -> torch.Tensor:
    """The positions of L context tokens whose KVzip score is one: the sinks and those from the template's opening
    (`prefix` tokens) on."""
    positions = torch.arange(length)
    return positions[(positions < reconstruction.SINKS) | (positions >= prefix)]


def collect(model: torch.nn.Module, layers: int, blocks: Sequence[torch.Tensor], repetition: reconstruction.Repetition,
            progress: Callable[[int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden (layers, N, D) float32, KVzip scores (layers, N, H_kv) float32) over the rows of every block (see the
    module docstring), each block prefilled by `model` and scored by KVzip's reconstruction pass."""
    states: list[torch.Tensor] = []
    scores: list[torch.Tensor] = []
    for index, ids in enumerate(blocks):
        with torch.inference_mode():
            found = prefill.exact(model, layers, ids, 0, index, ("hidden", "reconstruction"), repetition=repetition)
        rows = scored_rows(ids.shape[-1], repetition.prefix)
        states.append(torch.stack([part.read("hidden")[rows] for part in found]).float())
        scores.append(found[0].read("reconstruction")[:, :, rows].transpose(1, 2).float())
        if progress is not None:
            progress(index + 1)
    return torch.cat(states, dim=1), torch.cat(scores, dim=1)


def ridge(x: torch.Tensor, y: torch.Tensor, strength: float = RIDGE) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (H, D), bias (H,)) float64 minimising ‖X Wᵀ + b − Y‖² + λ‖W‖² for x (N, D), y (N, H), with
    λ = `strength` · tr(XcᵀXc) / D (see the module docstring)."""
    x, y = x.double(), y.double()
    mean_x, mean_y = x.mean(dim=0), y.mean(dim=0)
    centred = x - mean_x
    gram = centred.T @ centred
    penalty = strength * torch.diagonal(gram).sum() / gram.shape[0]
    weight = torch.linalg.solve(gram + penalty * torch.eye(gram.shape[0], dtype=gram.dtype), centred.T @ (y - mean_y))
    return weight.T, mean_y - mean_x @ weight


def mlp(x: torch.Tensor, y: torch.Tensor, width: int = WIDTH, steps: int = STEPS, seed: int = 0,
        rate: float = RATE, decay: float = DECAY) -> dict[str, torch.Tensor]:
    """A Linear(D, width)–GELU–Linear(width, H) fitted to x (N, D) → y (N, H) by `steps` full-batch Adam steps on the
    mean squared error of standardised inputs and targets plus `decay` times the squared weights (not the biases),
    initialised from `seed`; returned as kvpress's
    `nn.Sequential` names it ("0.weight", "0.bias", "2.weight", "2.bias", float32) with the standardisation folded
    in."""
    x, y = x.float().clone(), y.float().clone()  # plain tensors, even from an inference-mode prefill
    mean_x, scale_x = x.mean(dim=0), x.std(dim=0).clamp_min(1e-6)
    mean_y, scale_y = y.mean(dim=0), y.std(dim=0).clamp_min(1e-6)
    inputs, wanted = (x - mean_x) / scale_x, (y - mean_y) / scale_y
    generator = torch.Generator().manual_seed(seed)
    dim, heads = x.shape[1], y.shape[1]
    w0 = (torch.randn(width, dim, generator=generator) / dim ** 0.5).requires_grad_()
    b0 = torch.zeros(width, requires_grad=True)
    w2 = (torch.randn(heads, width, generator=generator) / width ** 0.5).requires_grad_()
    b2 = torch.zeros(heads, requires_grad=True)
    optimizer = torch.optim.Adam([w0, b0, w2, b2], lr=rate)
    with torch.inference_mode(False), torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            hidden = torch.nn.functional.gelu(torch.nn.functional.linear(inputs, w0, b0))
            loss = torch.nn.functional.mse_loss(torch.nn.functional.linear(hidden, w2, b2), wanted)
            loss = loss + decay * (w0.square().sum() + w2.square().sum())
            loss.backward()
            optimizer.step()
    with torch.no_grad():  # w0 ((x − μ)/σ) + b0 = (w0/σ) x + (b0 − w0 μ/σ); scale_y (w2 h + b2) + mean_y
        first = w0 / scale_x
        return {"0.weight": first, "0.bias": b0 - first @ mean_x, "2.weight": w2 * scale_y[:, None],
                "2.bias": b2 * scale_y + mean_y}


def fit(states: torch.Tensor, scores: torch.Tensor, kind: str, seed: int = 0,
        progress: Callable[[int], None] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """The surrogate of every layer fitted to hidden `states` (layers, N, D) → log KVzip `scores` (layers, N, H_kv):
    its tensors (float32, kvpress's names) and config.json (kvpress's KVzapConfig)."""
    if kind not in KINDS:
        raise ValueError(f"unknown surrogate '{kind}'; choose one of {', '.join(KINDS)}")
    layers, _, dim = states.shape
    heads = scores.shape[-1]
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(layers):
        y = targets(scores[layer])
        if kind == "linear":
            weight, bias = ridge(states[layer], y)
            tensors |= {f"layers.{layer}.weight": weight.float(), f"layers.{layer}.bias": bias.float()}
        else:
            found = mlp(states[layer], y, seed=seed + layer)
            tensors |= {f"layers.{layer}.{name}": tensor.contiguous() for name, tensor in found.items()}
        if progress is not None:
            progress(layer + 1)
    config = {"architectures": ["KVzapModel"], "model_type": "kvzap", "input_dim": dim, "output_dim": heads,
              "n_modules": layers, "hidden_dim": WIDTH if kind == "mlp" else None, "dtype": "float32"}
    return tensors, config


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two vectors (ties ranked by their mean rank)."""
    from scipy.stats import rankdata

    ranked_a, ranked_b = rankdata(a), rankdata(b)
    return float(np.corrcoef(ranked_a, ranked_b)[0, 1])


def quality(weights: dict[str, torch.Tensor], states: torch.Tensor, scores: torch.Tensor) -> pd.DataFrame:
    """Per (layer, kv_head): `r2`, 1 − Σ(ŷ − y)² / Σ(y − ȳ)² of the predicted log-scores ŷ against y = log KVzip
    score, and `spearman`, the rank correlation of ŷ and the scores, on hidden `states` (layers, N, D) and KVzip
    `scores` (layers, N, H_kv) the surrogate was not fitted on."""
    rows = []
    for layer in range(states.shape[0]):
        with torch.no_grad():
            predicted = surrogate_scores(weights, layer, states[layer].float()).double().numpy()
        wanted = targets(scores[layer]).numpy()
        for head in range(wanted.shape[1]):
            error = ((predicted[:, head] - wanted[:, head]) ** 2).sum()
            spread = ((wanted[:, head] - wanted[:, head].mean()) ** 2).sum()
            rows.append({"layer": layer, "kv_head": head, "r2": 1 - error / spread,
                         "spearman": spearman(predicted[:, head], scores[layer, :, head].double().numpy())})
    return pd.DataFrame(rows)
