"""The prose of the documents' marked paragraphs, written from the runs of the commands beside them.

One renderer per `<!-- numbers: NAME -->` marker (analyses/readme.py finds the markers and runs the commands):
`needs` names the `spectra` commands whose runs it reads, in the order they stand in the code block, and
`text` turns those runs into markdown — the paragraph's wording, with every number it quotes taken from a run
(counts and settings from run.json, so the prose cannot say 8 sequences where the command ran 32). Where a
sentence interprets the numbers, the renderer checks that the numbers bear it out and words it accordingly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

import spectra
from spectra.report.summaries import (approx_by_budget, gap_closed, interval_digits, key_ranks, scaling_fixed,
                                      scaling_layers, theorem1_rows)
from spectra.timings import summary


class RenderError(Exception):
    """A paragraph's runs do not hold what its renderer reads (a missing command, table or setting)."""


@dataclass(frozen=True)
class Renderer:
    """`needs`: the spectra commands (analyze, approx, plan-k, …) whose runs the paragraph quotes, in block order;
    `text`: the paragraph, from a map command → its runs (loaded) or, for plan-k, the plan it wrote."""

    needs: tuple[str, ...]
    text: Callable[[dict[str, list[Any]]], str]


# ---------------------------------------------------------------- formatting


def sig(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant figures, never in scientific notation (70.0, 137, 3670, 0.0041)."""
    if not math.isfinite(value) or value == 0:
        return f"{value:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{value:.{decimals}f}" if decimals >= 0 else f"{round(value, decimals):.0f}"


def span(values: Sequence[float], format: Callable[[float], str]) -> str:
    """'low–high' of some values, or the one value when both ends read the same."""
    low, high = format(min(values)), format(max(values))
    return low if low == high else f"{low}–{high}"


def slashed(values: Sequence[float], format: Callable[[float], str]) -> str:
    return " / ".join(format(value) for value in values)


def listed(values: Sequence[Any]) -> str:
    return ", ".join(str(value) for value in values)


def two(value: float) -> str:
    return f"{value:.2f}"


def interval(low: float, high: float) -> str:
    """A 95% interval's ends with as many decimals as it takes for them to differ (never 0.98–0.98)."""
    return "–".join(interval_digits(low, high))


# ---------------------------------------------------------------- reading runs


def only(runs: dict[str, list[Any]], command: str, index: int = 0) -> Any:
    found = runs.get(command, [])
    if len(found) <= index:
        raise RenderError(f"the code block has no `spectra {command}` command #{index + 1}")
    return found[index]


def extra(run: Any, name: str) -> Any:
    """An analysis setting as run.json records it (settings.extra, then the top level)."""
    settings = run.meta.get("settings", {}).get("extra", {})
    return settings[name] if name in settings else run.meta[name]


def evaluated(run: Any) -> int:
    """The sequences an approx run measured: with fitted methods, those after the calibration sequences."""
    return int(run.meta["samples"])


def by_budget(run: Any, method: str, table: str = "head_stats") -> pd.Series:
    """Mean over layers of the per-layer mean head-output error of `method`, per budget."""
    rows = approx_by_budget(run) if table == "head_stats" else \
        run.per_layer("out_err", table=table).groupby(["method", "budget"], sort=False)["out_err"].mean().reset_index()
    found = rows[rows["method"] == method].set_index("budget")["out_err"].sort_index()
    if found.empty:
        raise RenderError(f"{run.path} has no method {method}")
    return found


def end_to_end(run: Any, method: str, budget: int, allocation: str = "uniform") -> pd.Series:
    table = run.end_to_end
    if "allocation" in table.columns:
        table = table[table["allocation"] == allocation]
    rows = table[(table["method"] == method) & (table["budget"] == budget)]
    if rows.empty:
        raise RenderError(f"{run.path} has no end-to-end row for {method} at k = {budget} ({allocation})")
    return rows.iloc[0]


def pooled(run: Any, metric: str = "rank90") -> pd.Series:
    rows = run.exponents[(run.exponents["scope"] == "pooled") & (run.exponents["metric"] == metric)]
    return rows.iloc[0]


def layer_alphas(run: Any, metric: str = "rank90") -> list[float]:
    rows = run.exponents[(run.exponents["scope"] == "layer") & (run.exponents["metric"] == metric)]
    return list(rows.sort_values("layer")["alpha"])


# ---------------------------------------------------------------- the paragraphs


def smollm2_decoder(runs: dict[str, list[Any]]) -> str:
    """Perplexity per causal method and k, sink mass and key ranks per layer, loading time: a decoder's numbers."""
    analyzed, approximated = only(runs, "analyze"), only(runs, "approx")
    table = approximated.end_to_end
    budgets = sorted(set(table["budget"]))
    methods = list(dict.fromkeys(table["method"]))
    ppl = {method: slashed([end_to_end(approximated, method, k)["ppl"] for k in budgets], sig) for method in methods}
    quoted = [f"`{method}`{' gives' if not number else ''} {ppl[method]}" for number, method in enumerate(methods)]
    sink = analyzed.metrics.groupby("layer")["sink_mean"].mean()
    half = analyzed.layers // 2
    keys = key_ranks(analyzed)
    seconds = analyzed.meta["timings"]["seconds"]
    return (
        f"On SmolLM2 at n = {approximated.meta['n']} over the licence texts ({evaluated(approximated)} sequences), "
        f"the exact next-token perplexity is {sig(table['ppl_exact'].iloc[0])}; at k = {slashed(budgets, str)}, "
        f"{', '.join(quoted[:-1])} and {quoted[-1]}: "
        + ("random features do not stand in for a pretrained decoder's peaked attention. "
           if "performer-causal" in ppl and end_to_end(approximated, "performer-causal", budgets[-1])["ppl"]
           > 10 * table["ppl_exact"].iloc[0] else "")
        + f"Over the {analyzed.meta['samples']} sequences of the `analyze` command, sink mass per layer ranges from "
        f"{sig(sink.min(), 2)} (layer {sink.idxmin()}) to {sig(sink.max(), 2)} (layer {sink.idxmax()}), above 0.5 in "
        f"{int((sink.iloc[half:] > 0.5).sum())} of the last {analyzed.layers - half} layers and "
        f"{int((sink.iloc[:half] > 0.5).sum())} of the first {half}; "
        f"{'RoPE spreads the keys: ' if keys['attention'].mean() > keys['projection'].mean() else ''}the key rank "
        f"for 90% of a head's variance (per layer, mean over key/value heads) is "
        f"{span(keys['projection'], lambda x: sig(x, 2))} before RoPE, {span(keys['attention'], lambda x: sig(x, 2))} "
        f"after. Loading (the GGUF file, the tokenizer and the data) took {seconds['load']:.0f} s of that run's "
        f"{sum(seconds.values()):.0f} s."
    )


def key_means(run: Any) -> pd.DataFrame:
    """Per (stage, layer), the mean over key/value heads of the uncentred and centred key ranks and of the share
    of the keys' uncentred energy their mean holds, 1 − N·tr(covariance)/tr(Σkᵀk) (from qkv.npz)."""
    if run.qkv is None:
        raise RenderError(f"{run.path} has no qkv.csv: run analyze with --qkv")
    keys = run.qkv[run.qkv["tensor"] == "k"]
    table = keys.groupby(["stage", "layer"])[["dataset_rank90", "pca_rank90", "dataset_rank99", "pca_rank99"]].mean()
    with np.load(run.path / "qkv.npz") as arrays:
        for stage in table.index.unique("stage"):
            second, centred = arrays[f"k_{stage}_eigenvalues"], arrays[f"k_{stage}_pca_eigenvalues"]
            mean_share = 1 - arrays["tokens"][:, None] * centred.sum(-1) / second.sum(-1)
            table.loc[stage, "mean_share"] = mean_share.mean(1)
    return table


def smollm2_keys(runs: dict[str, list[Any]]) -> str:
    """Key ranks in the two conventions, uncentred (Σkᵀk) and centred (covariance, Loki's), and the mean's share."""
    run = only(runs, "analyze")
    table, d = key_means(run), int(run.qkv["d"].iloc[0])
    before, after = table.loc["projection"], table.loc["attention"]

    def rank(value: float) -> str:
        return sig(value, 2)

    lowest = before["pca_rank90"].idxmin()
    rest = before["pca_rank90"].drop(lowest)
    outlier = before["pca_rank90"][lowest] < 0.5 * rest.median()
    centred = (f"{span(rest, rank)} (layer {lowest}: {rank(before['pca_rank90'][lowest])})" if outlier
               else span(before["pca_rank90"], rank))
    wider = bool((before["pca_rank90"] > before["dataset_rank90"]).all())
    return (
        f"On {'one sequence' if run.meta['samples'] == 1 else str(run.meta['samples']) + ' sequences'} of {run.n} "
        f"tokens of the licence texts (the command above), SmolLM2's keys before RoPE "
        f"need {span(before['dataset_rank90'], rank)} of their {d} dimensions per layer (mean over key/value heads) "
        f"for 90% of their energy about zero (`dataset_rank90`, eigenvalues of Σkᵀk) and {centred} for 90% of their "
        f"variance about their mean (`pca_rank90`, eigenvalues of the covariance: Loki's convention); "
        f"for 99%, {span(before['dataset_rank99'], rank)} against {span(before['pca_rank99'], rank)}. "
        + (f"The mean key makes the difference: it alone, N‖μ‖², holds "
           f"{span(100 * before['mean_share'], lambda x: f'{x:.0f}')}% of the keys' energy Σ‖k‖² per layer, so "
           "the uncentred spectrum is one large eigenvalue (the mean) and a few more, while what varies from key to "
           "key spreads over many more directions. "
           if wider else "The centred rank is not above the uncentred one in every layer here. ")
        + "Before RoPE the mean adds the same logit q·μ to every key a query scores, which softmax ignores, so it is "
        "the centred rank that a head-dimension compressor (Loki's PCA basis, a low-rank key projection) has to "
        f"keep; after RoPE the mean is rotated differently at every position and no longer cancels: there the ranks "
        f"are {span(after['dataset_rank90'], rank)} uncentred and {span(after['pca_rank90'], rank)} centred, and the "
        f"mean holds {span(100 * after['mean_share'], lambda x: f'{x:.0f}')}% of the energy."
    )


def minilm_fitted(runs: dict[str, list[Any]]) -> str:
    """Held-out errors of the oracle, the fitted, pooled, PCA and random projections; overfitting; end to end."""
    run = only(runs, "approx")
    error = {method: by_budget(run, method) for method in
             ("svd", "linformer-fit(kv)", "pool-mean", "linformer-pca(kv)", "jl", "linformer(kv)")}
    budgets = list(error["svd"].index)
    middle, top = budgets[len(budgets) // 2], budgets[-1]
    lowered = 1 - error["linformer-fit(kv)"] / error["pool-mean"]
    calibration = {method: by_budget(run, method, "calibration") for method in ("linformer-fit(kv)", "pool-mean")}
    overfit = {method: error[method][middle] - calibration[method][middle] for method in calibration}
    gap = gap_closed(run)
    gap = gap[gap["method"] == "linformer-fit(kv)"]["gap_closed"]
    e2e = {method: end_to_end(run, method, top) for method in ("svd", "linformer-fit(kv)", "pool-mean")}
    pca_worse = bool((error["linformer-pca(kv)"] > error["pool-mean"]).all())
    return (
        f"What it gives on all-MiniLM-L6-v2 (n = {run.meta['n']}, licence texts, {extra(run, 'fit_samples')} calibration "
        f"and {evaluated(run)} held-out sequences, {extra(run, 'fit_steps')} Adam steps; held-out head-output "
        f"error, mean over layers and heads, at k = {slashed(budgets, str)}): the SVD oracle "
        f"{slashed(error['svd'], two)}, `linformer-fit(kv)` {slashed(error['linformer-fit(kv)'], two)}, `pool-mean` "
        f"(its start) {slashed(error['pool-mean'], two)}, `linformer-pca(kv)` {slashed(error['linformer-pca(kv)'], two)}. "
        f"Fitting lowers pooling's error by {span(lowered * 100, lambda x: f'{x:.0f}')}% (on the calibration sequences "
        f"it reaches {two(calibration['linformer-fit(kv)'][middle])} at k = {middle}: the gap of "
        f"{overfit['linformer-fit(kv)']:+.2f} to held-out is overfitting, against {overfit['pool-mean']:+.2f} for "
        f"pooling, which fits nothing); PCA directions are signed, and softmax over signed mixtures of keys stands in badly whatever the "
        f"scale{' — worse than pooling' if pca_worse else ''}. End to end (every layer substituted, last hidden "
        f"state) at k = {top}: SVD drift {two(e2e['svd']['hidden_rel_err'])} (cosine {two(e2e['svd']['cosine'])}), "
        f"fit {two(e2e['linformer-fit(kv)']['hidden_rel_err'])} ({two(e2e['linformer-fit(kv)']['cosine'])}), pooling "
        f"{two(e2e['pool-mean']['hidden_rel_err'])} ({two(e2e['pool-mean']['cosine'])}). The random projections the "
        f"theorems analyse are far worse — `jl` {slashed(error['jl'], lambda x: sig(x, 2))} and `linformer(kv)` "
        f"{slashed(error['linformer(kv)'], lambda x: sig(x, 2))} at k = {slashed(budgets, str)} — so measured from "
        f"them the fit closes {span(gap * 100, lambda x: f'{x:.0f}')}% of the gap to the oracle (the fraction the run "
        "prints per layer); yet a fixed projection of the sequence axis stays far from the per-sequence oracle."
    )


def minilm_fastformer(runs: dict[str, list[Any]]) -> str:
    """fastformer-fit beside linformer-fit(kv): held-out and calibration head-output error, then end to end."""
    run = only(runs, "approx")
    fast, linformer = by_budget(run, "fastformer-fit"), by_budget(run, "linformer-fit(kv)")
    budgets = list(linformer.index)
    calibration = by_budget(run, "fastformer-fit", "calibration").iloc[0]
    e2e = {method: [end_to_end(run, method, budget) for budget in budgets]
           for method in ("fastformer-fit", "linformer-fit(kv)", "pool-mean", "svd")}
    drift = e2e["fastformer-fit"][0]
    worse = bool(fast.iloc[0] > linformer.iloc[0])
    return (
        f"On all-MiniLM-L6-v2 (n = {run.meta['n']}, licence texts, {extra(run, 'fit_samples')} calibration and "
        f"{evaluated(run)} held-out sequences, {extra(run, 'fit_steps')} Adam steps) the held-out head-output error, "
        f"mean over layers and heads, is {two(fast.iloc[0])} for `fastformer-fit` ({two(calibration)} on the "
        f"calibration sequences; one fit serves every k) against {slashed(linformer, two)} for `linformer-fit(kv)` "
        f"at k = {slashed(budgets, str)}. End to end (every layer substituted, last hidden state) its drift is "
        f"{two(drift['hidden_rel_err'])} (cosine {two(drift['cosine'])}), against "
        f"{slashed([row['hidden_rel_err'] for row in e2e['linformer-fit(kv)']], two)} (cosine "
        f"{slashed([row['cosine'] for row in e2e['linformer-fit(kv)']], two)}) for `linformer-fit(kv)`, "
        f"{slashed([row['hidden_rel_err'] for row in e2e['pool-mean']], two)} for `pool-mean` and "
        f"{slashed([row['hidden_rel_err'] for row in e2e['svd']], two)} for the SVD oracle."
        + (" Two pooled vectors per head cannot follow a pretrained head's per-query attention: per head, Fastformer's "
           f"O(n d) cost buys less than a fitted Linformer projection at k = {budgets[0]}." if worse else "")
    )


def smollm2_fastformer(runs: dict[str, list[Any]]) -> str:
    """fastformer-fit-causal's next-token perplexity on a decoder beside window and topk at every k."""
    run = only(runs, "approx")
    table = run.end_to_end
    budgets = sorted(set(table[table["method"] != "fastformer-fit-causal"]["budget"]))
    exact = table["ppl_exact"].iloc[0]
    fast = end_to_end(run, "fastformer-fit-causal", budgets[0])["ppl"]
    ppl = {method: [end_to_end(run, method, budget)["ppl"] for budget in budgets] for method in ("window", "topk")}
    beaten = [method for method in ppl if fast > max(ppl[method])]
    return (
        f"On SmolLM2-135M-Instruct (n = {run.meta['n']}, licence texts, {extra(run, 'fit_samples')} calibration and "
        f"{evaluated(run)} held-out sequences, {extra(run, 'fit_steps')} Adam steps), with every layer substituted the "
        f"next-token perplexity is {sig(fast)} for `fastformer-fit-causal` (one fit serves every k) against "
        f"{slashed(ppl['window'], sig)} for `window` and {slashed(ppl['topk'], sig)} for `topk` at k = "
        f"{slashed(budgets, str)}; exact attention gives {sig(exact)}. Per head, its held-out output error is "
        f"{two(by_budget(run, 'fastformer-fit-causal').iloc[0])} (mean over layers and heads; "
        f"{two(by_budget(run, 'fastformer-fit-causal', 'calibration').iloc[0])} on the calibration sequences) "
        f"against {slashed(by_budget(run, 'window'), two)} for `window`."
        + (f" A causal Fastformer fitted per head is worse than {' and '.join(f'`{m}`' for m in beaten)} at every k: "
           "pooling a prefix into one vector loses what a decoder's heads attend to." if beaten else "")
    )


def minilm_plan(runs: dict[str, list[Any]]) -> str:
    """A k plan from the spectrum against a uniform k of equal cost, end to end, for the oracle, fit and pooling."""
    plan, run = only(runs, "plan-k"), only(runs, "approx")
    uniform = int(run.meta["budget"][0])
    rows = {method: (end_to_end(run, method, uniform), end_to_end(run, method, uniform, "plan"))
            for method in ("svd", "linformer-fit(kv)", "pool-mean")}
    drift = {method: (pair[0]["hidden_rel_err"], pair[1]["hidden_rel_err"]) for method, pair in rows.items()}
    change = {method: (after - before) / before for method, (before, after) in drift.items()}
    spectral = change["svd"] < -0.1 and all(abs(change[method]) < abs(change["svd"]) / 2
                                            for method in ("linformer-fit(kv)", "pool-mean"))
    moves = "lowers" if change["svd"] < 0 else "raises"
    return (
        f"On MiniLM (n = {plan['n']}, the plan for {plan['energy']:.0%} of each layer's nuclear norm: k = "
        f"{listed(entry['budget'] for entry in plan['layers'])} against a uniform {uniform}; {evaluated(run)} "
        f"sequences), the plan {moves} the SVD oracle's end-to-end drift from {two(drift['svd'][0])} to "
        f"{two(drift['svd'][1])} (cosine {rows['svd'][0]['cosine']:.3f} → {rows['svd'][1]['cosine']:.3f}), "
        + ("but fitted and pooled projections barely move" if spectral else "and fitted and pooled projections move")
        + f" (fit {two(drift['linformer-fit(kv)'][0])} → {two(drift['linformer-fit(kv)'][1])}, pooling "
        f"{two(drift['pool-mean'][0])} → {two(drift['pool-mean'][1])})"
        + (": their error is not spectral, so a plan made from the spectrum does not redistribute it." if spectral
           else ".")
    )


def growth(run: Any) -> str:
    """What the pooled exponent of rank90 says, in the README's words."""
    row = pooled(run)
    if row["alpha_low"] >= 0.9:
        return "grows in proportion to n"
    return "grows, but slower than n" if row["alpha_low"] > 0.1 else "does not measurably grow"


def minilm_scaling(runs: dict[str, list[Any]]) -> str:
    """rank90 against n on an encoder, its exponent, and c at a fixed k and at n/4."""
    run = only(runs, "scaling")
    ranks = scaling_layers(run).set_index("layer").loc["all"]
    lengths = run.lengths
    fixed = scaling_fixed(run).set_index("k")
    row, quarter, first = pooled(run), fixed.loc["n/4"], min(run.c_fixed["budget"])
    goes = " → ".join(f"{ranks['n=' + str(n)]:.1f}" for n in lengths)
    return (
        f"On all-MiniLM-L6-v2 over the licence texts ({run.meta['samples']} sequences per n, n = {lengths[0]}…"
        f"{lengths[-1]}), rank90 pooled over heads goes "
        f"{goes}, α = {two(row['alpha'])} (interval "
        f"{interval(row['alpha_low'], row['alpha_high'])}); per layer {listed(map(two, layer_alphas(run)))}. c at k = "
        f"n/4 {'stays at ' if two(quarter.min()) == two(quarter.max()) else 'stays within '}"
        f"{span(quarter, two)} for every n while c at k = {first} falls from {two(fixed.loc[str(first)].iloc[0])} to "
        f"{two(fixed.loc[str(first)].iloc[-1])}: "
        + ("this encoder's attention keeps a fixed *fraction* of its spectrum per unit of n, so the k that holds a "
           "fixed share of it grows linearly." if growth(run) == "grows in proportion to n" else
           f"the k that holds a fixed share of this encoder's attention {growth(run)}.")
    )


def smollm2_scaling(runs: dict[str, list[Any]]) -> str:
    """The same growth on a decoder at long n, a few layers."""
    run = only(runs, "scaling")
    row, layers = pooled(run), run.meta["settings"]["extra"]["layers"]
    fixed = run.c_fixed[run.c_fixed["budget"] == max(run.c_fixed["budget"])]
    budget = int(fixed["budget"].iloc[0])
    fixed = fixed[fixed["n"] > budget].groupby("n")["c"].mean()
    return (
        f"SmolLM2 (n = {run.lengths[0]}…{run.lengths[-1]}, {run.meta['samples']} sequences, layers {layers}; "
        f"{run.meta['wall_seconds'] / 60:.1f} minutes) {growth(run) == 'grows in proportion to n' and 'says the same' or 'differs'}: "
        f"pooled α = {two(row['alpha'])} ({interval(row['alpha_low'], row['alpha_high'])}), per layer "
        f"{span(layer_alphas(run), two)}, c at k = {budget} falling from {two(fixed.iloc[0])} (n = {fixed.index[0]}) "
        f"to {two(fixed.iloc[-1])} (n = {fixed.index[-1]})."
    )


def minilm_k_needed(runs: dict[str, list[Any]]) -> str:
    """The smallest k whose head-output error reaches a target, against n, beside the growth of rank90."""
    run = only(runs, "scaling")
    if run.k_needed is None:
        raise RenderError(f"{run.path} has no k_needed.csv: the command needs --approx-target")
    method = run.meta["methods"][0]
    needed = run.k_needed[run.k_needed["layer"].isna() & (run.k_needed["method"] == method)].sort_values("n")
    fit = run.exponents[(run.exponents["metric"] == "k_needed") & (run.exponents["method"] == method)].iloc[0]
    rank = pooled(run)
    ks = [("none" if pd.isna(k) else str(int(k))) for k in needed["k_needed"]]
    pace = "slower than" if fit["alpha"] < rank["alpha"] else "at least as fast as"
    return (
        f"On MiniLM ({run.meta['samples']} sequences per n), the smallest k of the powers of two tried whose `{method}` "
        f"head-output error, averaged over layers, is at most {run.meta['target']} is {listed(ks)} for n = "
        f"{listed(needed['n'])}: α = {two(fit['alpha'])} on that coarse grid, {pace} rank90 over the same sequences "
        f"(α = {two(rank['alpha'])})" + (" — still far from constant." if fit["alpha"] > 0.3 else ".")
    )


def theorems_synthetic(runs: dict[str, list[Any]]) -> str:
    """Theorem 1's statement against its bound on Gaussian q, k, v."""
    run = only(runs, "theorems")
    rows = theorem1_rows(run, "output")
    rows = rows[rows["method"] == "jl"]
    largest = rows.loc[rows["pr"].idxmax()]
    top = rows[(rows["budget"] == rows["budget"].max()) & (rows["eps"] == rows["eps"].max())].iloc[0]
    return (
        f"On Gaussian q, k, v at n = {run.meta['n']} (the `--synthetic` command above, {run.meta['samples']} samples) "
        f"the empirical Pr(‖P̃w − Pw‖ ≤ ε‖Pw‖) is at most {largest['pr']:.3f} for every k up to "
        f"{int(rows['budget'].max())} and every ε up to {rows['eps'].max():g} (largest at k = {int(largest['budget'])}, "
        f"ε = {largest['eps']:g}), where the stated bound at k = {int(top['budget'])}, ε = {top['eps']:g} is "
        f"{top['bound']:.4f}. Theorem 2 is reported both against its own right side ‖softmax(w)‖‖V‖_F and against "
        "‖softmax(w)V‖, so the same gap is visible there."
    )


def smollm2_cache(runs: dict[str, list[Any]]) -> str:
    """The continuation's NLL per press and ratio after an exact prefill, what ranks first and last, ThinK against
    eviction at equal memory, and whether the attention mass a press keeps orders the presses as their NLL does."""
    run = only(runs, "cache")
    table, meta = run.table, run.meta
    full = table[table["press"] == "full"].iloc[0]
    presses = [press for press in dict.fromkeys(table["press"]) if press != "full"]
    ratios = sorted(set(table["ratio"]) - {0.0})
    nll = table.set_index(["press", "ratio"])["nll"]
    header = "| press | " + " | ".join(f"r = {ratio:g}" for ratio in ratios) + " |"
    rows = [header, "|---|" + "---|" * len(ratios)]
    for press in presses:
        cells = [f"{nll[(press, ratio)]:.3f}" if (press, ratio) in nll.index else "" for ratio in ratios]
        label = f"{press} (key channels)" if (table[table["press"] == press]["key_channel_ratio"] > 0).any() else press
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    evicting = [press for press in presses if not (table[table["press"] == press]["key_channel_ratio"] > 0).any()]
    ends = []
    for ratio in (0.5 if 0.5 in ratios else ratios[len(ratios) // 2], ratios[-1]):
        at = nll[[(press, ratio) for press in evicting if (press, ratio) in nll.index]]
        best, worst = at.idxmin()[0], at.idxmax()[0]
        ends.append(f"at r = {ratio:g} `{best}` loses least (+{at.min() - full['nll']:.3f} nats) and `{worst}` most "
                    f"(+{at.max() - full['nll']:.3f})")
    text = (f"On SmolLM2, {meta['scored']} sequences of the licence texts with a context of {meta['context']} tokens "
            f"prefilled exactly and {meta['continuation']} tokens scored after it, the full cache gives a "
            f"continuation NLL of {full['nll']:.3f} nats/token (perplexity {sig(full['ppl'])}). The continuation's "
            "NLL against each compressed cache (r: the fraction of cached tokens removed; for think, of key "
            "channels, which saves r/2 of the memory):\n\n" + "\n".join(rows) + "\n\n"
            f"Among the presses that evict tokens, {'; '.join(ends)}.")
    if "knorm" in evicting and "random" in evicting:
        worse = [ratio for ratio in ratios if nll[("knorm", ratio)] > nll[("random", ratio)]]
        text += (f" Knorm (keep the smallest keys) is worse than dropping tokens at random at "
                 f"{'every ratio' if len(worse) == len(ratios) else 'r = ' + listed([f'{r:g}' for r in worse])}."
                 if worse else " Knorm beats random eviction at every ratio.")
    if "think" in presses and 0.5 in ratios and 0.25 in ratios:
        same = nll[[(press, 0.25) for press in evicting]]
        think = nll[("think", 0.5)]
        text += (f" At equal memory saved (a quarter), ThinK at r = 0.5 gives {think:.3f}, "
                 f"{'better' if think < same.min() else 'worse'} than the best eviction at r = 0.25 "
                 f"(`{same.idxmin()[0]}`, {same.min():.3f}).")
    mass = run.head_stats.groupby(["press", "ratio"])["mass_kept"].mean()
    pairs = pd.DataFrame({"mass": mass, "nll": nll}).loc[[(p, r) for p in evicting for r in ratios
                                                            if (p, r) in nll.index]]
    rho = pairs["mass"].corr(pairs["nll"], method="spearman")
    text += (f" The share of the continuation's attention mass on the kept context tokens (per head, averaged) "
             f"{'orders' if rho < -0.7 else 'only loosely orders'} the eviction presses as their NLL does "
             f"(Spearman ρ = {rho:.2f} over the {len(pairs)} press–ratio pairs).")
    return text


def smollm2_cache_spectral(runs: dict[str, list[Any]]) -> str:
    """The spectral presses beside snapkv: NLL per ratio, the memory each really saves, and the comparisons the
    presses were built for (loki against snapkv, lowrank against eviction at equal memory, linformer's mixing)."""
    run = only(runs, "cache")
    table = run.table
    full = table[table["press"] == "full"].iloc[0]
    presses = [press for press in dict.fromkeys(table["press"]) if press != "full"]
    ratios = sorted(set(table["ratio"]) - {0.0})
    indexed = table.set_index(["press", "ratio"])
    nll, saved = indexed["nll"], indexed["saved"]
    rows = ["| press | " + " | ".join(f"r = {ratio:g}" for ratio in ratios) + " |", "|---|" + "---|" * len(ratios)]
    for press in presses:
        cells = []
        for ratio in ratios:
            cell = f"{nll[(press, ratio)]:.3f}"
            if abs(saved[(press, ratio)] - ratio) > 0.01:
                cell += f" (saves {saved[(press, ratio)]:.2f})"
            cells.append(cell)
        rows.append(f"| {press} | " + " | ".join(cells) + " |")
    calibrated = run.meta.get("calibration", {}).get("used", 0)
    fitted = (f"`loki` and `lowrank` fitted on {calibrated} calibration sequences" if calibrated else
              "`loki` and `lowrank` fitted on each context itself, the oracle")
    text = (f"Over {run.meta['scored']} sequences (context {run.meta['context']}, continuation "
            f"{run.meta['continuation']}; full cache {full['nll']:.3f} nats/token; {fitted}), the continuation's "
            "NLL (where a "
            "press saves another share of memory than r, that share in brackets):\n\n" + "\n".join(rows) + "\n\n")
    notes = []
    if {"loki", "snapkv"} <= set(presses):
        gap = [nll[("loki", r)] - nll[("snapkv", r)] for r in ratios]
        notes.append(f"Scoring SnapKV's window in a quarter of the key dimensions (`loki`) costs "
                     f"{slashed(gap, lambda x: f'{x:+.3f}')} nats at r = {slashed(ratios, lambda r: f'{r:g}')}")
    if {"leverage", "snapkv"} <= set(presses):
        worse = sum(nll[("leverage", r)] > nll[("snapkv", r)] for r in ratios)
        notes.append(f"the keys' own geometry (`leverage`) is worse than the attention SnapKV reads at {worse} of "
                     f"{len(ratios)} ratios")
    if {"lowrank", "snapkv"} <= set(presses):
        better = [r for r in ratios if nll[("lowrank", r)] < nll[("snapkv", r)]]
        notes.append("storing every token in fewer dimensions (`lowrank`) beats evicting tokens (`snapkv`) at equal "
                     "memory " + (f"at r = {listed([f'{r:g}' for r in better])}" if better else "at no ratio"))
    if "linformer" in presses and min(nll[("linformer", r)] for r in ratios) > full["nll"] + 1:
        notes.append(f"mixing the tokens (`linformer`) gives {span([nll[('linformer', r)] for r in ratios], lambda x: f'{x:.1f}')} "
                     "nats: a softmax over signed mixtures of keys does not stand in for "
                     "attention over tokens without training, as `approx` found for fixed projections")
    return text + "; ".join(notes) + "."


def speed_line(runs: dict[str, list[Any]]) -> str:
    """The stage timings `spectra analyze` prints at its end, as run.json recorded them."""
    run = only(runs, "analyze")
    return (f"({run.meta['model']['name']}, n = {run.n}, {run.meta['samples']} sequences, on the machine that last "
            f"ran `python analyses/readme.py`) ended with:\n\n```\n{summary(run.meta['timings'])}\n```")



def named_heads(table: pd.DataFrame, column: str, most: int = 4) -> str:
    """'L<layer>H<head> (score)' of the heads with the highest `column`, at most `most` of them."""
    top = table.sort_values(column, ascending=False).head(most)
    return ", ".join(f"L{row.layer}H{row.head} ({two(getattr(row, column))})" for row in top.itertuples(index=False))


def one_model_heads(approximated: Any, diagnosed: Any) -> str:
    """What `spectra heads` says of one model: its head types, the clearest heads of each kind, where the weights'
    rank and the attention's part ways, DuoAttention's pattern and the method map with its rule."""
    from scipy.stats import spearmanr

    from spectra.methodmap import INDUCTION, PREVIOUS, RETRIEVAL, SINK

    table, meta = diagnosed.diagnosis, diagnosed.meta
    name = meta["model"]["name"]
    counts = table["head_type"].value_counts()
    kinds = ", ".join(f"{count} {kind}" for kind, count in counts.items())
    parts = [f"On {name} ({len(table)} heads, n = {diagnosed.n}, {meta['samples']} sequences) the heads are {kinds}."]
    prev = table[table["prev"] >= PREVIOUS]
    if len(prev):
        parts.append(f"Previous-token heads (prev ≥ {PREVIOUS}): {named_heads(prev, 'prev')}.")
    induction = table[table["induction_score"] >= INDUCTION]
    if len(induction):
        parts.append(f"Induction heads (score ≥ {INDUCTION}) number {len(induction)}, the clearest "
                     f"{named_heads(induction, 'induction_score')}, all in layers {span(induction['layer'], str)}.")
    sinks = table[table["sink_share"] >= SINK]
    layers = diagnosed.layers
    if len(sinks):
        late = int((sinks["layer"] >= layers // 2).sum())
        parts.append(f"{len(sinks)} heads put more than ε = {extra(diagnosed, 'eps')} on the first token for most "
                     f"queries (sink share ≥ {SINK}), {late} of them in the second half of the layers.")
    retrieval = table[table["retrieval"] >= RETRIEVAL]
    by_layer = table.groupby("layer")["retrieval"].mean()
    parts.append(f"Streaming one head to {extra(diagnosed, 'sinks')} sinks + {extra(diagnosed, 'recent')} recent tokens "
                 f"moves its layer's output by {span(table['retrieval'], two)} ({len(retrieval)} heads ≥ {RETRIEVAL}); "
                 f"the layer mean is highest in layer {by_layer.idxmax()} ({two(by_layer.max())}).")
    head_dim = diagnosed.weights["qk_sigma"].shape[-1]
    constant = table["qk_rank90"].nunique() == 1 or table["rank90"].nunique() == 1
    rho = math.nan if constant else spearmanr(table["qk_rank90"], table["rank90"]).statistic
    above = int((table["rank90"] > head_dim).sum())
    parts.append(f"The weights allow rank90 {span(table['qk_rank90'], lambda x: f'{x:.0f}')} (W_QK) and "
                 f"{span(table['ov_rank90'], lambda x: f'{x:.0f}')} (W_OV) of d = {head_dim}, while P's rank90 spans "
                 f"{span(table['rank90'], lambda x: sig(x, 2))}: {above} of {len(table)} heads use more than d "
                 "(the softmax raises rank)"
                 + (f", and across heads the two ranks correlate at Spearman ρ = {two(rho)}." if not constant else "."))
    gap = table["rank90"] - table["qk_rank90"]
    low = table.loc[gap.idxmin()]
    parts.append(f"They part ways most at L{low['layer']}H{low['head']}, whose P needs rank {sig(low['rank90'], 2)} where "
                 f"its W_QK allows {low['qk_rank90']:.0f}. Attention received and key norm correlate at a median of "
                 f"{two(table['keynorm_corr'].median())} over heads"
                 + (" (attention goes to keys of small norm)." if table["keynorm_corr"].median() < -0.1 else "."))
    if diagnosed.rules is not None:
        mapped = diagnosed.method_map
        for rule in diagnosed.rules.itertuples(index=False):
            at = mapped[mapped["budget"] == rule.budget]
            won = at["winner"].value_counts()
            if len(won) == 1:
                second = at["runner_up"].value_counts()
                parts.append(f"At k = {rule.budget} `{won.index[0]}` wins on every head among "
                             f"`{', '.join(approximated.meta['methods'])}` (runner-up mostly `{second.index[0]}`, its "
                             f"error a median {sig(at['margin'].median(), 2)}× the winner's): nothing to predict.")
                continue
            shares = ", ".join(f"`{method}` {count}" for method, count in won.items())
            if rule.rule.startswith("→"):
                parts.append(f"At k = {rule.budget} the winners among `{', '.join(approximated.meta['methods'])}` are "
                             f"{shares}: no split of the diagnosis beats always `{rule.baseline_winner}`.")
                continue
            parts.append(f"At k = {rule.budget} the winners among `{', '.join(approximated.meta['methods'])}` are "
                         f"{shares}; a depth-2 rule on the diagnosis (first split `{rule.rule.split(':')[0]}`) predicts "
                         f"{rule.held_out_accuracy:.0%} of held-out heads against {rule.baseline:.0%} for always "
                         f"`{rule.baseline_winner}`.")
    return " ".join(parts)


def heads_models(runs: dict[str, list[Any]]) -> str:
    """`spectra heads` on each model of the block (an approx run, then the heads run joined with it)."""
    pairs = zip(runs.get("approx", []), runs.get("heads", []))
    paragraphs = [one_model_heads(approximated, diagnosed) for approximated, diagnosed in pairs]
    if not paragraphs:
        raise RenderError("the code block has no `spectra approx` and `spectra heads` pair")
    return "\n\n".join(paragraphs)


RENDERERS: dict[str, Renderer] = {
    "smollm2-decoder": Renderer(("analyze", "approx"), smollm2_decoder),
    "smollm2-keys": Renderer(("analyze",), smollm2_keys),
    "minilm-fitted": Renderer(("approx",), minilm_fitted),
    "minilm-plan": Renderer(("analyze", "plan-k", "approx"), minilm_plan),
    "minilm-fastformer": Renderer(("approx",), minilm_fastformer),
    "smollm2-fastformer": Renderer(("approx",), smollm2_fastformer),
    "minilm-scaling": Renderer(("scaling",), minilm_scaling),
    "smollm2-scaling": Renderer(("scaling",), smollm2_scaling),
    "minilm-k-needed": Renderer(("scaling",), minilm_k_needed),
    "theorems-synthetic": Renderer(("theorems",), theorems_synthetic),
    "speed-line": Renderer(("analyze",), speed_line),
    "heads-models": Renderer(("approx", "heads"), heads_models),
    "smollm2-cache": Renderer(("cache",), smollm2_cache),
    "smollm2-cache-spectral": Renderer(("cache",), smollm2_cache_spectral),
}


def loaded(arguments: list[str], out: Path | None, work: Path) -> Any:
    """What a renderer reads of one command: its run loaded back, or for plan-k the plan JSON it wrote."""
    if arguments[0] == "plan-k":
        if "--out" not in arguments:
            raise RenderError("give the plan-k command an --out file, which the approx command beside it reads")
        return json.loads((work / arguments[arguments.index("--out") + 1]).read_text())
    if out is None:
        raise RenderError(f"`spectra {' '.join(arguments)}` wrote no run directory")
    return spectra.load_run(out)


def render(name: str, ran: list[tuple[list[str], Path | None]], work: Path) -> str:
    """The markdown of paragraph `name` from the commands that ran beside it ((arguments, run directory) each)."""
    renderer = RENDERERS[name]
    runs: dict[str, list[Any]] = {}
    for arguments, out in ran:
        if arguments[0] in renderer.needs:
            runs.setdefault(arguments[0], []).append(loaded(arguments, out, work))
    missing = [command for command in dict.fromkeys(renderer.needs) if command not in runs]
    if missing:
        raise RenderError(f"the paragraph '{name}' quotes `spectra {missing[0]}`, which its code block does not run "
                          "(or which needs the Hub)")
    return renderer.text(runs)
