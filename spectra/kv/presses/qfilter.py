"""`qfilter(DIR)` (Q-Filters, Godey et al. 2025, arXiv:2503.02812): keep the keys with the largest projection on one
fixed direction per key/value head, the direction along which the queries lean.

Queries and keys of a head are anisotropic: their distributions share one dominant direction u, and a query's mean
lies along it, E[q] ≈ κ u. The logit a key can expect from the queries is then E[q]·k ≈ κ (u·k), so the projection of
each cached key on u ranks the keys as their attention would, without any query at compression time (a
context-agnostic score, compatible with fused attention). u is fitted once per model: the top right singular vector of
the queries of calibration text (`spectra artifacts qfilter`, `kv.artifactfit`), the filter f one per layer and
key/value head.

kvpress 0.5.5's QFilterPress is the peer: its score is −f·k_j for each cached (post-RoPE) key, in the cache's dtype,
the top n_kept = max(1, int(L·(1 − r))) kept per key/value head. kvpress loads f from the hub for the few models whose
filters were published (`nthngdy/<model>_qfilt`); spectra reads them from DIR, the directory kvpress's `QFilters`
module loads (`kv.artifacts`: config.json and model.safetensors' `q_filters`, layers × key/value heads × head
dimension), which `spectra artifacts qfilter MODEL --data …` writes for any model, with f oriented against the mean
query so that −f·k grows with the expected logit.
"""

from __future__ import annotations

import torch

from ...errors import SpectraError
from .. import artifacts
from .base import Prefill, Press, ScorerPress, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 75


def qfilter_scores(keys: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """(H_kv, L) −f_h·k_j for the keys (H_kv, L, d) and one layer's filters (H_kv, d), in the keys' dtype."""
    return -(filters[:, None, :].to(keys.dtype) * keys).sum(dim=-1)


@register
class QFilter(ScorerPress):
    """`qfilter(DIR)`: score −f·k with the Q-Filters in DIR (see the module docstring)."""

    name, summary = "qfilter", "the keys projecting most on the queries' principal direction (Q-Filters)"
    peer = "QFilterPress"
    guide = ("Q-Filters (kvpress's `QFilterPress`) with the filters in the directory it names: each cached key is "
             "scored by minus its projection on one fixed direction per layer and key/value head, the top right "
             "singular vector of the queries (oriented against their mean), so the keys the queries are expected "
             "to attend to are kept. kvpress loads the filters from the hub for the models someone published them "
             "for; `spectra artifacts qfilter MODEL --data FILE --out DIR` fits them on local text for any model "
             "and writes DIR in the format kvpress's `QFilters.from_pretrained(DIR)` loads (config.json and "
             "model.safetensors), so both tools score with the same filters. The ratio is the share of the cached "
             "tokens removed: each key/value head keeps max(1, int(L · (1 − r))).")
    #: no wrapper takes it: `adakv(<scorer>)` names its scorer alone, and this press needs its directory
    scorer = False
    argument, check = "artifact", "spectra.kv.artifacts:check_qfilter"

    def __init__(self, filters: torch.Tensor | None = None, where: str = "") -> None:
        self.filters, self.where = filters, where
        if filters is not None:
            self.name = f"qfilter({where})"  # type: ignore[misc]

    def bind(self, argument: str) -> QFilter:
        """The press scoring with the filters in the directory `argument`."""
        return QFilter(artifacts.load("qfilter", argument)["q_filters"], argument)

    def fresh(self) -> Press:
        return self

    def score(self, prefill: Prefill, ratio: float) -> torch.Tensor:
        if self.filters is None:
            raise ValueError("qfilter needs its filters: name it as qfilter(<directory>)")
        layers, kv_heads, dim = self.filters.shape
        if layers <= prefill.layer or kv_heads != prefill.kv_heads or dim != prefill.head_dim:
            raise SpectraError(f"the Q-Filters in {self.where} are {layers} layers × {kv_heads} key/value heads × "
                               f"{dim} dims; layer {prefill.layer} has {prefill.kv_heads} key/value heads of "
                               f"{prefill.head_dim} dims")
        return qfilter_scores(prefill.key, self.filters[prefill.layer].to(prefill.key.device))
