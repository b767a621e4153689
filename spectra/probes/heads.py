"""`spectra heads`' probe: every layer's P streamed into per-(layer, head) diagnosis scores, beside the spectrum
probe's metrics of the same P, the heads' weight spectra and their induction scores.

Per sequence and head (`spectra.anatomy.diagnosis`): the ROW_SCORES (sink share, previous-token, local and top-10% mass,
key-norm correlation) and the retrieval score, averaged over sequences; rank90, c at `at`, the sink mass and the
entropy come from `SpectrumProbe` on the same P (one definition of each). The weight spectra (`spectra.anatomy.weights`) and
the induction scores (one forward pass of TransformerLens's repeated random tokens, decoders only) are fixed by the
model and the seed, computed once when the probe is built. Results: diagnosis.csv (one row per layer and head),
kv_heads.csv, full_attention_heads.tsv and config.json (DuoAttention's pattern directory), method_map.csv and rules.csv (joined with an
approx run's heads.csv, when given), metrics.csv and curves.npz (the spectrum probe's), weights.npz.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..kv import headpattern
from ..capture import Captured
from ..anatomy.diagnosis import ROW_SCORES, induction_stripe, induction_tokens, retrieval_scores, row_scores
from ..anatomy.methodmap import duo_pattern, head_types, method_map
from ..seeds import Domain, derive_seed
from ..spectrum import METRICS, sink_start
from ..stats import Moments, State
from ..anatomy.weights import LayerWeights, group_of
from .base import Probe
from .spectrum import SpectrumProbe

SCORES = (*ROW_SCORES, "retrieval")
#: diagnosis.csv's columns taken from the spectrum probe's metrics (renamed: sink is the mean sink mass)
FROM_SPECTRUM = {"sink": "sink_mean", "entropy": "entropy", "rank90": "rank90", "c_at": "c_at"}
#: diagnosis.csv's score columns, in order (after layer, head, kv_head, sequences; before the weight ranks)
COLUMNS = ("sink_share", "sink_mean", "prev", "local", "entropy", "induction_score", "retrieval", "top10",
           "keynorm_corr", "rank90", "c_at")


def induction_scores(source: Any, seed: int) -> np.ndarray:
    """Induction scores (layers, heads) of a decoder read by `source` (a `sources.ModelSource`): one forward pass of
    `diagnosis.induction_tokens` (drawn with the run's seed), each layer's P reduced by `induction_stripe`."""
    loaded = source.loaded
    tokenizer = loaded.tokenizer
    bos = tokenizer.bos_token_id
    tokens = induction_tokens(int(loaded.model.config.vocab_size), list(tokenizer.all_special_ids), bos,
                              derive_seed(seed, Domain.INDUCTION))
    found = np.full((loaded.layers, loaded.heads), np.nan)

    def observe(captured: Captured) -> None:
        found[captured.layer] = induction_stripe(captured.p, 1 if bos is not None else 0).mean(0).cpu().numpy()

    ids = torch.from_numpy(tokens)
    source.forward(ids, torch.ones_like(ids), index=list(range(len(ids))), observe=observe)
    return found


class HeadsProbe(Probe):
    """Moments over sequences of the diagnosis scores of every (layer, head), beside `spectrum`'s metrics.

    `weights`: each layer's `LayerWeights` (W^O is needed for the retrieval score; None leaves it NaN);
    `spectra`: `weights.head_spectra` of them (or {}); `induction`: (layers, heads) or None (encoders);
    `approx`: an approx run's heads.csv to build the method map from; `duo_share`: the share of key/value heads the
    DuoAttention pattern keeps at full attention."""

    def __init__(self, spectrum: SpectrumProbe, *, kv_heads: int, eps: float, window: int, sinks: int, recent: int,
                 weights: list[LayerWeights] | None, spectra: Mapping[str, np.ndarray],
                 induction: np.ndarray | None, approx: pd.DataFrame | None, duo_share: float, seed: int = 0) -> None:
        self.spectrum, self.kv_heads = spectrum, kv_heads
        self.layers, self.heads, self.n = spectrum.layers, spectrum.heads, spectrum.n
        self.eps, self.window, self.sinks, self.recent = eps, window, sinks, recent
        self.weights, self.spectra, self.induction = weights, dict(spectra), induction
        self.approx, self.duo_share, self.seed = approx, duo_share, seed
        self.scores = Moments.zeros((self.layers, self.heads, len(SCORES)))

    def update(self, captured: Captured) -> None:
        self.spectrum.update(captured)
        p, valid = captured.p, captured.valid
        rows = row_scores(p, captured.k, valid, captured.causal, sink_start(self.n), self.eps, self.window)
        if self.weights is None:
            retrieval = torch.full(rows.shape[:2], float("nan"), dtype=torch.float64)
        else:
            w = self.weights[captured.layer]
            retrieval = retrieval_scores(p, captured.v, valid, torch.from_numpy(w.w_o).to(p.device),
                                         None if w.b_o is None else torch.from_numpy(w.b_o).to(p.device),
                                         self.sinks, self.recent)
        self.scores.add(captured.layer, torch.cat([rows, retrieval.to(rows.device)[..., None]], dim=-1))

    def state(self) -> State:
        return {**{f"spectrum/{key}": value for key, value in self.spectrum.state().items()},
                **self.scores.state("scores")}

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.spectrum.load_state({key.removeprefix("spectrum/"): value for key, value in arrays.items()
                                  if key.startswith("spectrum/")})
        self.scores = Moments.from_arrays(arrays, "scores")

    def diagnosis(self) -> pd.DataFrame:
        """diagnosis.csv: one row per (layer, head), every score's mean over sequences, and the head type."""
        layer, head = np.meshgrid(np.arange(self.layers), np.arange(self.heads), indexing="ij")
        columns: dict[str, np.ndarray] = {"layer": layer.ravel(), "head": head.ravel(),
                                          "kv_head": np.tile(group_of(self.heads, self.kv_heads), self.layers),
                                          "sequences": self.scores.count.ravel().astype(np.int64)}
        metrics, scores = self.spectrum.metrics.mean, self.scores.mean
        induction = self.induction if self.induction is not None else np.full((self.layers, self.heads), np.nan)
        measured = {**{name: scores[..., i] for i, name in enumerate(SCORES)},
                    **{FROM_SPECTRUM[name]: metrics[..., METRICS.index(name)] for name in FROM_SPECTRUM},
                    "induction_score": induction}
        for name in COLUMNS:
            columns[name] = measured[name].ravel()
        for name in ("qk_rank90", "qk_rank99", "ov_rank90", "ov_rank99"):
            columns[name] = (self.spectra[name].ravel().astype(float) if name in self.spectra
                             else np.full(self.layers * self.heads, np.nan))
        table = pd.DataFrame(columns)
        return table.assign(head_type=head_types(table))

    def tables(self) -> dict[str, pd.DataFrame]:
        diagnosis = self.diagnosis()
        found = {"diagnosis.csv": diagnosis, **self.spectrum.tables()}
        if np.isfinite(diagnosis["retrieval"]).all():
            full, per_kv = duo_pattern(diagnosis, self.layers, self.heads, self.kv_heads, self.duo_share)
            found.update({"full_attention_heads.tsv": full, "kv_heads.csv": per_kv,
                          "config.json": pd.DataFrame([headpattern.config(self.sinks, self.recent)])})
        if self.approx is not None:
            mapped, rules = method_map(diagnosis, self.approx, self.seed)
            found.update({"method_map.csv": mapped, "rules.csv": rules})
        return found

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        found = dict(self.spectrum.arrays())
        sigma = {name: value for name, value in self.spectra.items() if name.endswith(("_sigma", "_cum"))}
        if sigma:
            found["weights.npz"] = sigma
        return found
