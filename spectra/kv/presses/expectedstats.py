"""`expected_attention_stats(DIR)` (Expected Attention, Devoto et al. 2025, arXiv:2510.00636, with query statistics
fitted once per model): `expected_attention`'s score, its query distribution read from a file instead of estimated
from the context being compressed.

`expected_attention` estimates the mean μ and covariance Σ of the future queries from the context's own queries
before RoPE. A short or unusual context gives a poor estimate; statistics gathered once over calibration text
(`spectra artifacts expected_attention_stats`, `kv.artifactfit`: every query head's pre-RoPE queries of each
calibration sequence but its first 4, their mean and their covariance divided by N − 1) are a steadier prior, and the
press then needs no query of the context at all. Per layer, μ (H, d) and Σ (H, d, d) are rotated to the next 512
positions after the context as `expected_attention` rotates its own (R̄μ, R̄ΣR̄ᵀ, `expected.future_rotation`), and each
key is scored by the same expected attention (`expected.expected_attention`): the softmax over the keys after the 4
sinks of k·R̄μ/√d + kᵀR̄ΣR̄ᵀk/(2d), averaged over each key/value group and weighted by the value norm, the sinks kept.

kvpress 0.5.5's ExpectedAttentionStatsPress is the peer, at its defaults (n_future_positions 512, n_sink 4,
use_covariance and use_vnorm on, epsilon 0), given `stats_folder=DIR`: the directory its `ExpectedAttentionStats`
module loads (config.json and model.safetensors' `query_mean`, `query_cov`, layers × query heads × head dimension),
which kvpress otherwise fetches from the hub for the few models someone published statistics for.
"""

from __future__ import annotations

import torch

from ...errors import SpectraError
from .. import artifacts
from .base import Prefill, Press, ScorerPress, register
from .expected import SINKS, expected_attention, future_rotation

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 75


@register
class ExpectedAttentionStats(ScorerPress):
    """`expected_attention_stats(DIR)`: Expected Attention from the query statistics in DIR (see the module
    docstring)."""

    name, summary = "expected_attention_stats", "expected_attention with query statistics fitted once per model"
    peer = "ExpectedAttentionStatsPress"
    guide = ("Expected Attention (kvpress's `ExpectedAttentionStatsPress`) with the query statistics in the "
             "directory it names: the mean and covariance of each query head's pre-RoPE queries, gathered once "
             "over calibration text instead of estimated from the context being compressed, rotated to the next "
             "512 positions; each key is scored by the attention a query so distributed is expected to pay it, "
             "weighted by its value's norm, and the first 4 tokens are kept. kvpress loads the statistics from the"
             " hub for the models someone published them for; `spectra artifacts expected_attention_stats MODEL "
             "--data FILE --out DIR` gathers them on local text for any model and writes DIR in the format kvpress"
             " loads (its `stats_folder`). The ratio is the share of the cached tokens removed: each key/value "
             "head keeps max(1, int(L · (1 − r))).")
    #: no wrapper takes it: `adakv(<scorer>)` names its scorer alone, and this press needs its directory
    scorer = False
    argument, check = "artifact", "spectra.kv.artifacts:check_statistics"
    needs_rope = True
    min_context = 5  # more than its sinks

    def __init__(self, statistics: dict[str, torch.Tensor] | None = None, where: str = "") -> None:
        self.stats, self.where = statistics, where
        if statistics is not None:
            self.name = f"expected_attention_stats({where})"  # type: ignore[misc]

    def bind(self, argument: str) -> ExpectedAttentionStats:
        """The press reading the statistics in the directory `argument`."""
        return ExpectedAttentionStats(artifacts.load("expected_attention_stats", argument), argument)

    def fresh(self) -> Press:
        return self

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        if self.stats is None:
            raise ValueError("expected_attention_stats needs its statistics: name it as "
                             "expected_attention_stats(<directory>)")
        if prefill.length <= SINKS:
            raise ValueError(f"expected_attention_stats needs more than {SINKS} context tokens, got "
                             f"{prefill.length}")
        if prefill.rope is None:
            raise ValueError("expected_attention_stats reads the model's RoPE, which this prefill did not keep")
        mean, covariance = self.stats["query_mean"], self.stats["query_cov"]
        layers, heads, dim = mean.shape
        if layers <= prefill.layer or heads != prefill.q.shape[0] or dim != prefill.head_dim:
            raise SpectraError(f"the query statistics in {self.where} are {layers} layers × {heads} heads × {dim} "
                               f"dims; layer {prefill.layer} has {prefill.q.shape[0]} heads of {prefill.head_dim} "
                               "dims")
        dtype, device = prefill.key.dtype, prefill.key.device
        mean = mean[prefill.layer].to(device, dtype)
        covariance = covariance[prefill.layer].to(device, dtype)
        rotation = future_rotation(prefill)
        return expected_attention(prefill, mean @ rotation.T, rotation @ (covariance @ rotation.T))
