"""`kvzap(DIR)` (KVzap, arXiv:2601.07891): keep the pairs a small per-layer surrogate of the hidden states predicts
KVzip would keep.

KVzip (`kvzip`, arXiv:2505.23416) scores a cached pair by how strongly the model attends to it while repeating the
context — exact, query-agnostic, but a second pass over the whole context per example. KVzap learns that score: for
each layer, a linear map or a two-layer MLP (Linear–GELU–Linear) from the token's hidden state at the attention's
input (after the layer's input norm, what kvpress's hook reads as `hidden_states`) to one score per key/value head,
regressing the log of KVzip's score. At compression time the score costs one small matrix product per layer, with no
pass over the context and no attention weights, so it works in prefilling and decoding alike.

kvpress 0.5.5's KVzapPress is the peer: a ScorerPress whose score of layer ℓ is `layers[ℓ](hidden_states)`
transposed to (H_kv, L), in the hidden states' dtype, the top n_kept = max(1, int(L·(1 − r))) kept per key/value
head (no sink or window kept apart). kvpress downloads the surrogate (`nvidia/KVzap-{linear|mlp}-<model>`, published
for a few 8B models); spectra reads it from DIR, in the format kvpress's `KVzapModel.from_pretrained` loads
(`kv.artifacts.SURROGATE`), which `spectra artifacts kvzap MODEL --data …` fits for any model (`kv.surrogate`), so
both tools score with the same surrogate.
"""

from __future__ import annotations

import torch

from ...errors import SpectraError
from .. import artifacts
from .base import Prefill, Press, ScorerPress, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 76


def surrogate_scores(weights: dict[str, torch.Tensor], layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """(…, H_kv) the surrogate's scores of the hidden states `hidden` (…, D) at `layer`, in their dtype: the linear
    `layers.{layer}.weight/bias`, or the MLP `layers.{layer}.0` → exact GELU → `layers.{layer}.2` (kvpress's
    `nn.Linear` / `nn.Sequential(Linear, GELU, Linear)`)."""
    def linear(name: str, x: torch.Tensor) -> torch.Tensor:
        weight, bias = weights[f"layers.{layer}.{name}weight"], weights[f"layers.{layer}.{name}bias"]
        return torch.nn.functional.linear(x, weight.to(x.device, x.dtype), bias.to(x.device, x.dtype))

    if f"layers.{layer}.weight" in weights:
        return linear("", hidden)
    return linear("2.", torch.nn.functional.gelu(linear("0.", hidden)))


@register
class KVzap(ScorerPress):
    """`kvzap(DIR)`: score each cached pair with the surrogate in DIR (see the module docstring)."""

    name, summary = "kvzap", "the pairs a fitted surrogate of the hidden states predicts KVzip keeps (KVzap)"
    peer = "KVzapPress"
    guide = ("KVzap (kvpress's `KVzapPress`) with the surrogate in the directory it names: per layer, a linear map or "
             "a two-layer MLP from each token's hidden state at the attention's input to one score per key/value "
             "head, fitted to predict the log of KVzip's reconstruction score, so it keeps what KVzip would keep "
             "without KVzip's second pass over the context. kvpress downloads the surrogate from the hub for the few "
             "models NVIDIA published one for; `spectra artifacts kvzap MODEL --data FILE --out DIR [--surrogate "
             "linear|mlp]` fits it on local text for any model (KVzip's scores of the text, then a ridge regression "
             "or a small MLP per layer) and writes DIR in the format kvpress's `KVzapModel.from_pretrained(DIR)` "
             "loads, so both tools score with the same surrogate. The ratio is the share of the cached tokens "
             "removed: each key/value head keeps max(1, int(L · (1 − r))).")
    #: a scorer a wrapper takes written with its directory: `dms(kvzap(DIR),-6)`, `adakv(kvzap(DIR))`
    scorer = True
    reads = ("hidden",)
    argument, check = "artifact", "spectra.kv.artifacts:check_surrogate"

    def __init__(self, weights: dict[str, torch.Tensor] | None = None, where: str = "") -> None:
        self.weights, self.where = weights, where
        if weights is not None:
            self.name = f"kvzap({where})"  # type: ignore[misc]
            self.shape = artifacts.SURROGATE.shape(where)

    def bind(self, argument: str) -> KVzap:
        """The press scoring with the surrogate in the directory `argument`."""
        return KVzap(artifacts.load("kvzap", argument), argument)

    def fresh(self) -> Press:
        return self

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        if self.weights is None:
            raise ValueError("kvzap needs its surrogate: name it as kvzap(<directory>)")
        hidden = prefill.read("hidden")
        layers, dim, kv_heads = self.shape["layers"], self.shape["hidden"], self.shape["kv_heads"]
        if layers <= prefill.layer or dim != hidden.shape[-1] or kv_heads != prefill.kv_heads:
            raise SpectraError(f"the KVzap surrogate in {self.where} is {layers} layers × {dim} hidden dimensions × "
                               f"{kv_heads} key/value heads; layer {prefill.layer} has {hidden.shape[-1]} "
                               f"hidden dimensions and {prefill.kv_heads} key/value heads")
        return surrogate_scores(self.weights, prefill.layer, hidden).transpose(0, 1)
