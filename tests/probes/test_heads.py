"""The heads probe: its scores are the means over sequences of `diagnosis`' per-sequence scores, the spectrum
columns are the spectrum probe's own, and its state restores the same tables (resume, several processes)."""

from __future__ import annotations

import numpy as np
import torch

from spectra.capture import Captured
from spectra.anatomy.diagnosis import retrieval_scores, row_scores
from spectra.probes.heads import HeadsProbe
from spectra.probes.spectrum import SpectrumProbe
from spectra.stats import plain
from spectra.anatomy.weights import LayerWeights, head_spectra


def make_probe(weights, layers=2, heads=4, kv_heads=2, n=12):
    return HeadsProbe(SpectrumProbe(layers, heads, n, 3), kv_heads=kv_heads, eps=0.3, window=3, sinks=1, recent=3,
                      weights=weights, spectra=head_spectra(weights, heads, kv_heads), induction=None, approx=None,
                      duo_share=0.5)


def records(seed=0, layers=2, heads=4, kv_heads=2, n=12, d=3):
    generator = torch.Generator().manual_seed(seed)
    found = []
    for start in (0, 2):
        for layer in range(layers):
            q = torch.randn(2, heads, n, d, generator=generator) * 2
            key, value = (torch.randn(2, kv_heads, n, d, generator=generator) for _ in range(2))
            mask = torch.triu(torch.full((n, n), torch.finfo(torch.float32).min), 1)[None, None].expand(2, 1, n, n)
            found.append(Captured.of(layer, q, key, value, mask.contiguous(), causal=True, index=(start, start + 1)))
    return found


def layer_weights(layers=2, heads=4, kv_heads=2, width=8, d=3):
    rng = np.random.default_rng(1)
    return [LayerWeights(rng.standard_normal((heads * d, width)), rng.standard_normal((kv_heads * d, width)),
                         rng.standard_normal((kv_heads * d, width)), rng.standard_normal((width, heads * d)),
                         rng.standard_normal(width)) for _ in range(layers)]


def test_scores_are_means_over_sequences_beside_the_spectrum_probe_s_metrics() -> None:
    weights = layer_weights()
    probe = make_probe(weights)
    captured = records()
    for record in captured:
        probe.update(record)
    table = probe.tables()["diagnosis.csv"]
    metrics = probe.tables()["metrics.csv"]
    for layer in range(2):
        mine = [r for r in captured if r.layer == layer]
        rows = torch.cat([row_scores(r.p, r.k, r.valid, True, 1, 0.3, 3) for r in mine]).mean(0)
        w = weights[layer]
        retrieval = torch.cat([retrieval_scores(r.p, r.v, r.valid, torch.from_numpy(w.w_o), torch.from_numpy(w.b_o),
                                                1, 3) for r in mine]).mean(0)
        part = table[table["layer"] == layer]
        np.testing.assert_allclose(part["prev"], rows[:, 1].numpy(), rtol=1e-12)
        np.testing.assert_allclose(part["keynorm_corr"], rows[:, 4].numpy(), rtol=1e-12)
        np.testing.assert_allclose(part["retrieval"], retrieval.numpy(), rtol=1e-12)
        np.testing.assert_allclose(part["sink_mean"], metrics[metrics["layer"] == layer]["sink_mean"], rtol=0)
        np.testing.assert_allclose(part["rank90"], metrics[metrics["layer"] == layer]["rank90_mean"], rtol=0)
    assert list(table["kv_head"][:4]) == [0, 0, 1, 1] and (table["sequences"] == 4).all()


def test_state_restores_the_same_tables() -> None:
    weights = layer_weights()
    first = make_probe(weights)
    for record in records():
        first.update(record)
    second = make_probe(weights)
    second.load_state(plain(first.state()))
    for name, frame in first.tables().items():
        assert frame.equals(second.tables()[name]), name
