"""analyses/readme_decoders.py on tiny runs: each renderer's values are the run's own numbers, read here straight
from its CSV and JSON files with pandas (not through the summaries the renderers use), and each claim is decided as
an independent computation on those files decides it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import spectra

from .conftest import meta, quiet, slashed

import readme_values as fmt  # noqa: E402  (conftest.py puts analyses/ on the path)
import readme_decoders as module  # noqa: E402

sig, span, two = fmt.sig, fmt.span, fmt.two


def test_the_decoder_paragraph(decoder_runs) -> None:
    rendered = module.smollm2_decoder(decoder_runs)
    values, analyzed, approximated = rendered.values, decoder_runs["analyze"][0], decoder_runs["approx"][0]
    e2e = pd.read_csv(approximated.path / "end_to_end.csv")
    ppl = {method: e2e[e2e["method"] == method].sort_values("budget")["ppl"] for method in ("window", "topk")}
    assert values["sequences"] == str(meta(approximated)["samples"]) and values["budgets"] == "4 / 8"
    assert values["ppl_exact"] == sig(e2e["ppl_exact"].iloc[0]) and values["topk"] == slashed(ppl["topk"], sig)
    assert rendered.claims["topk-beats-window"] == bool((ppl["topk"].to_numpy() < ppl["window"].to_numpy()).all())
    sink = pd.read_csv(analyzed.path / "metrics.csv").groupby("layer")["sink_mean"].mean()
    assert (values["sink_min"], values["sink_min_layer"]) == (sig(sink.min(), 2), str(sink.idxmin()))
    keys = pd.read_csv(analyzed.path / "qkv.csv")
    keys = keys[keys["tensor"] == "k"].groupby(["stage", "layer"])["dataset_rank90"].mean()
    assert values["keys_before"] == span(keys["projection"], lambda x: sig(x, 2))
    assert rendered.claims["rope-spreads-keys"] == bool((keys["attention"] > keys["projection"]).mean() > 0.5)
    assert values["load"] == f"{meta(analyzed)['timings']['seconds']['load']:.0f}"


def test_the_key_paragraph_quotes_both_conventions(decoder_runs) -> None:
    analyzed = decoder_runs["analyze"][0]
    rendered = module.smollm2_keys({"analyze": [analyzed]})
    keys = pd.read_csv(analyzed.path / "qkv.csv")
    keys = keys[(keys["tensor"] == "k") & (keys["stage"] == "projection")].groupby("layer")
    assert rendered.values["before_energy90"] == span(keys["dataset_rank90"].mean(), fmt.sig2)
    assert rendered.values["before_variance99"] == span(keys["pca_rank99"].mean(), fmt.sig2)
    arrays = np.load(analyzed.path / "qkv.npz")
    assert np.all(arrays["tokens"] == analyzed.n * analyzed.meta["samples"]), "packed: n tokens per sequence"
    second, centred = arrays["k_projection_eigenvalues"], arrays["k_projection_pca_eigenvalues"]
    share = (1 - arrays["tokens"][:, None] * centred.sum(-1) / second.sum(-1)).mean(1) * 100
    assert rendered.values["mean_before"] == span(share, lambda x: f"{x:.0f}")
    assert rendered.claims["centred-wider"] == bool((keys["pca_rank90"].mean() > keys["dataset_rank90"].mean()).all())
    with pytest.raises(module.RenderError, match="no qkv.csv"):
        module.smollm2_keys({"analyze": [dataclasses.replace(analyzed, qkv=None)]})


def test_the_heads_paragraph(llama_dir, text_file, tmp_path) -> None:
    common = dict(length=24, samples=2, progress=None, notify=quiet)
    approximated = spectra.approx(str(llama_dir), str(text_file), budget=[4, 8], methods="window,pool-mean",
                                  out=tmp_path / "a", **common)
    diagnosed = spectra.heads(str(llama_dir), str(text_file), approx=approximated.path, out=tmp_path / "h", **common)
    rendered = module.heads_model({"approx": [approximated], "heads": [diagnosed]})
    values, table = rendered.values, pd.read_csv(diagnosed.path / "diagnosis.csv")
    assert (values["heads"], values["n"], values["sequences"]) == (str(len(table)), "24", "2")
    assert values["types"] == ", ".join(f"{count} {kind}" for kind, count in table["head_type"].value_counts().items())
    assert values["retrieval"] == span(table["retrieval"], two)
    assert values["rank"] == span(table["rank90"], fmt.sig2)
    rules = pd.read_csv(diagnosed.path / "rules.csv")
    mapped = pd.read_csv(diagnosed.path / "method_map.csv")
    for rule in rules.itertuples(index=False):
        winners = mapped[mapped["budget"] == rule.budget]["winner"].unique()
        assert rendered.claims[f"one-winner-{rule.budget}"] == (len(winners) == 1)
        assert rendered.claims[f"no-rule-{rule.budget}"] == rule.rule.startswith("→")
        if not rule.rule.startswith("→"):
            assert values[f"accuracy_{rule.budget}"] == f"{rule.held_out_accuracy:.0%}"
            assert rendered.claims[f"rule-beats-baseline-{rule.budget}"] == bool(rule.held_out_accuracy > rule.baseline)


def test_the_cache_paragraph(cache_run) -> None:
    rendered = module.smollm2_cache({"cache": [cache_run]})
    table = pd.read_csv(cache_run.path / "cache.csv")
    nll = table.set_index(["press", "ratio"])["nll"]
    assert rendered.values["full_nll"] == f"{nll[('full', 0.0)]:.3f}" and rendered.values["scored"] == "2"
    lines = rendered.values["table"].splitlines()
    assert lines[0] == "| press | r = 0.25 | r = 0.5 |"
    assert f"| knorm | {nll[('knorm', 0.25)]:.3f} | {nll[('knorm', 0.5)]:.3f} |" in lines
    saved = table.set_index(["press", "ratio"])["saved"]
    assert f"| think (key channels) | {nll[('think', 0.25)]:.3f} (saves {saved[('think', 0.25)]:.2f}) | " \
           f"{nll[('think', 0.5)]:.3f} (saves {saved[('think', 0.5)]:.2f}) |" in lines
    assert len(lines) == 2 + 11, "a row for every press the run has"
    kept = table.set_index(["press", "ratio"])["kept"]
    evicted = [press for press in dict.fromkeys(table["press"]) if press != "full"
               and all(kept[(press, r)] == int(70 * (1 - r)) for r in (0.25, 0.5))]
    assert module.evicting(cache_run) == evicted and {"think", "lowrank"}.isdisjoint(evicted)
    evicting = nll[[(press, 0.5) for press in evicted]]
    assert rendered.values["best_half"] == f"`{evicting.idxmin()[0]}`"
    assert rendered.claims["knorm-beats-random"] == all(nll[("knorm", r)] < nll[("random", r)] for r in (0.25, 0.5))


def test_the_spectral_cache_paragraph(cache_run) -> None:
    rendered = module.smollm2_cache_spectral({"cache": [cache_run]})
    table = pd.read_csv(cache_run.path / "cache.csv").set_index(["press", "ratio"])
    gaps = [table.loc[("loki", r), "nll"] - table.loc[("snapkv", r), "nll"] for r in (0.25, 0.5)]
    assert rendered.values["loki_cost"] == " / ".join(f"{gap:+.3f}" for gap in gaps)
    assert rendered.claims["fitted-on-context"] is True
    assert rendered.claims["lowrank-never-beats-eviction"] == all(
        table.loc[("lowrank", r), "nll"] >= table.loc[("snapkv", r), "nll"] for r in (0.25, 0.5))
