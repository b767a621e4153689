"""The values and claims of the decoder pages' paragraphs (docs/decoders.md, docs/heads.md, docs/cache.md): a
decoder's perplexity under causal stand-ins, sink mass and key ranks; what each head is; the cache's presses."""

from __future__ import annotations

import numpy as np
import pandas as pd

from readme_values import (RenderError, Runs, count, end_to_end, evaluated, extra, only, percent, sig, sig2,
                           sink_layers, slashed, span, table, two)
from slots import Rendered
from spectra.report.summaries import key_ranks


def smollm2_decoder(runs: Runs) -> Rendered:
    """Perplexity per causal method and k, sink mass and key ranks per layer, loading time: a decoder's numbers."""
    analyzed, approximated = only(runs, "analyze"), only(runs, "approx")
    frame = approximated.end_to_end
    budgets = sorted(set(frame["budget"]))
    exact = frame["ppl_exact"].iloc[0]
    ppl = {method: [end_to_end(approximated, method, k)["ppl"] for k in budgets]
           for method in ("window", "topk", "performer-causal")}
    keys = key_ranks(analyzed)  # dataset_rank90: the uncentred energy rank
    seconds = analyzed.meta["timings"]["seconds"]
    return Rendered({"n": str(approximated.meta["n"]), "sequences": str(evaluated(approximated)), "ppl_exact": sig(exact),
                     "budgets": slashed(budgets), "window": slashed(ppl["window"], sig), "topk": slashed(ppl["topk"], sig),
                     "performer": slashed(ppl["performer-causal"], sig), "analyzed": str(analyzed.meta["samples"]),
                     **sink_layers(analyzed), "keys_before": span(keys["projection"], sig2),
                     "keys_after": span(keys["attention"], sig2), "load": f"{seconds['load']:.0f}",
                     "total": f"{sum(seconds.values()):.0f}"},
                    {"performer-far-worse": bool(min(ppl["performer-causal"]) > 10 * exact),
                     "topk-beats-window": all(t < w for t, w in zip(ppl["topk"], ppl["window"])),
                     "rope-spreads-keys": bool((keys["attention"] > keys["projection"]).mean() > 0.5)})


def key_means(run) -> pd.DataFrame:
    """Per (stage, layer), the mean over key/value heads of the uncentred and centred key ranks and of the share
    of the keys' uncentred energy their mean holds, 1 − N·tr(covariance)/tr(Σkᵀk) (from qkv.npz)."""
    if run.qkv is None:
        raise RenderError(f"{run.path} has no qkv.csv: run analyze with --qkv")
    keys = run.qkv[run.qkv["tensor"] == "k"]
    means = keys.groupby(["stage", "layer"])[["dataset_rank90", "pca_rank90", "dataset_rank99", "pca_rank99"]].mean()
    with np.load(run.path / "qkv.npz") as arrays:
        for stage in means.index.unique("stage"):
            second, centred = arrays[f"k_{stage}_eigenvalues"], arrays[f"k_{stage}_pca_eigenvalues"]
            share = 1 - arrays["tokens"][:, None] * centred.sum(-1) / second.sum(-1)
            means.loc[stage, "mean_share"] = share.mean(1)
    return means


def smollm2_keys(runs: Runs) -> Rendered:
    """Key ranks in the two conventions, uncentred (Σkᵀk) and centred (covariance, Loki's), and the mean's share."""
    run = only(runs, "analyze")
    means, d = key_means(run), int(run.qkv["d"].iloc[0])
    before, after = means.loc["projection"], means.loc["attention"]
    centred = before["pca_rank90"]
    lowest = centred.idxmin()
    rest = centred.drop(lowest)
    outlier = centred[lowest] < 0.5 * rest.median()
    return Rendered({"sequences": count(int(run.meta["samples"]), "sequence"), "n": str(run.n), "d": str(d),
                     "before_energy90": span(before["dataset_rank90"], sig2),
                     "before_variance90": (f"{span(rest, sig2)} (layer {lowest}: {sig2(centred[lowest])})" if outlier
                                           else span(centred, sig2)),
                     "before_energy99": span(before["dataset_rank99"], sig2),
                     "before_variance99": span(before["pca_rank99"], sig2),
                     "mean_before": span(100 * before["mean_share"], percent),
                     "after_energy90": span(after["dataset_rank90"], sig2),
                     "after_variance90": span(after["pca_rank90"], sig2),
                     "mean_after": span(100 * after["mean_share"], percent)},
                    {"centred-wider": bool((before["pca_rank90"] > before["dataset_rank90"]).all())})



def named_heads(frame: pd.DataFrame, column: str, most: int = 4) -> str:
    """'L<layer>H<head> (score)' of the heads with the highest `column`, at most `most` of them."""
    top = frame.sort_values(column, ascending=False).head(most)
    return ", ".join(f"L{row.layer}H{row.head} ({two(getattr(row, column))})" for row in top.itertuples(index=False))


def heads_model(runs: Runs) -> Rendered:
    """What `spectra heads` says of one model: head types, the clearest heads of each kind, where the weights'
    rank and the attention's part ways, and per budget the method map's winners and the rule that predicts them."""
    from scipy.stats import spearmanr

    from spectra.anatomy.methodmap import INDUCTION, PREVIOUS, RETRIEVAL, SINK

    approximated, diagnosed = only(runs, "approx"), only(runs, "heads")
    frame, meta = diagnosed.diagnosis, diagnosed.meta
    prev, induction = frame[frame["prev"] >= PREVIOUS], frame[frame["induction_score"] >= INDUCTION]
    sinks, retrieval = frame[frame["sink_share"] >= SINK], frame[frame["retrieval"] >= RETRIEVAL]
    by_layer = frame.groupby("layer")["retrieval"].mean()
    gap = frame["rank90"] - frame["qk_rank90"]
    low = frame.loc[gap.idxmin()]
    constant = frame["qk_rank90"].nunique() == 1 or frame["rank90"].nunique() == 1
    values = {"model": meta["model"]["name"], "heads": str(len(frame)), "n": str(diagnosed.n),
              "sequences": str(meta["samples"]),
              "types": ", ".join(f"{number} {kind}" for kind, number in frame["head_type"].value_counts().items()),
              "prev_threshold": f"{PREVIOUS:g}", "prev_heads": named_heads(prev, "prev"),
              "induction_threshold": f"{INDUCTION:g}", "induction_count": str(len(induction)),
              "induction_heads": named_heads(induction, "induction_score"),
              "induction_layers": span(induction["layer"], str) if len(induction) else "",
              "eps": f"{extra(diagnosed, 'eps'):g}", "sink_threshold": f"{SINK:g}", "sink_count": str(len(sinks)),
              "sink_late": str(int((sinks["layer"] >= diagnosed.layers // 2).sum())),
              "sinks": str(extra(diagnosed, "sinks")), "recent": str(extra(diagnosed, "recent")),
              "retrieval": span(frame["retrieval"], two), "retrieval_threshold": f"{RETRIEVAL:g}",
              "retrieval_count": str(len(retrieval)), "retrieval_layer": str(by_layer.idxmax()),
              "retrieval_layer_mean": two(by_layer.max()), "qk": span(frame["qk_rank90"], lambda x: f"{x:.0f}"),
              "ov": span(frame["ov_rank90"], lambda x: f"{x:.0f}"), "d": str(diagnosed.weights["qk_sigma"].shape[-1]),
              "rank": span(frame["rank90"], sig2), "methods": f"`{', '.join(approximated.meta['methods'])}`",
              "rho": "" if constant else two(spearmanr(frame["qk_rank90"], frame["rank90"]).statistic),
              "part_head": f"L{low['layer']}H{low['head']}", "part_rank": sig2(low["rank90"]),
              "part_qk": f"{low['qk_rank90']:.0f}", "keynorm": two(frame["keynorm_corr"].median())}
    values["above"] = str(int((frame["rank90"] > int(values["d"])).sum()))
    claims = {"softmax-raises-rank": int(values["above"]) > len(frame) / 2,
              "small-keys-attended": bool(frame["keynorm_corr"].median() < -0.1)}
    for rule in (diagnosed.rules.itertuples(index=False) if diagnosed.rules is not None else ()):
        won = diagnosed.method_map[diagnosed.method_map["budget"] == rule.budget]["winner"].value_counts()
        k = rule.budget
        values |= {f"winners_{k}": ", ".join(f"`{method}` {number}" for method, number in won.items()),
                   f"baseline_winner_{k}": f"`{rule.baseline_winner}`", f"baseline_{k}": f"{rule.baseline:.0%}"}
        if not rule.rule.startswith("→"):
            values |= {f"split_{k}": f"`{rule.rule.split(':')[0]}`", f"accuracy_{k}": f"{rule.held_out_accuracy:.0%}"}
        claims |= {f"rule-beats-baseline-{k}": (not rule.rule.startswith("→")
                                                and rule.held_out_accuracy > rule.baseline),
                   f"no-rule-{k}": rule.rule.startswith("→"), f"one-winner-{k}": len(won) == 1}
    return Rendered(values, claims)


def cache_table(run, presses: list[str], ratios: list[float]) -> str:
    """The continuation's NLL per press and ratio; a press that saves another share of memory than r says which."""
    indexed = run.table.set_index(["press", "ratio"])
    rows = []
    for press in presses:
        cells = []
        for ratio in ratios:
            cell = f"{indexed.loc[(press, ratio), 'nll']:.3f}"
            saved = indexed.loc[(press, ratio), "saved"]
            cells.append(cell + (f" (saves {saved:.2f})" if abs(saved - ratio) > 0.01 else ""))
        channels = bool((run.table[run.table["press"] == press]["key_channel_ratio"] > 0).any())
        rows.append([f"{press} (key channels)" if channels else press, *cells])
    return table(["press", *(f"r = {ratio:g}" for ratio in ratios)], rows)


def evicting(run) -> list[str]:
    """The presses of a cache run that evict tokens: at every ratio each head keeps kvpress's int(L·(1 − r)) of the
    L context tokens (ThinK and lowrank keep every token in fewer dimensions, linformer keeps mixed rows)."""
    frame = run.table[run.table["press"] != "full"]
    context = int(run.meta["context"])
    whole = frame["kept"] == [max(1, int(context * (1 - ratio))) for ratio in frame["ratio"]]
    return [press for press, rows in whole.groupby(frame["press"], sort=False) if rows.all()]


def smollm2_cache(runs: Runs) -> Rendered:
    """The continuation's NLL per press and ratio after an exact prefill, what ranks first and last, ThinK against
    eviction at equal memory, and whether the attention mass a press keeps orders the presses as their NLL does."""
    run = only(runs, "cache")
    frame, meta = run.table, run.meta
    full = frame[frame["press"] == "full"].iloc[0]
    presses = [press for press in dict.fromkeys(frame["press"]) if press != "full"]
    ratios = sorted(set(frame["ratio"]) - {0.0})
    nll = frame.set_index(["press", "ratio"])["nll"]
    evicted = evicting(run)
    values = {"scored": str(meta["scored"]), "context": str(meta["context"]), "continuation": str(meta["continuation"]),
              "full_nll": f"{full['nll']:.3f}", "full_ppl": sig(full["ppl"]), "table": cache_table(run, presses, ratios)}
    for name, ratio in (("half", 0.5), ("last", ratios[-1])):
        at = nll[[(press, ratio) for press in evicted]]
        values |= {f"{name}": f"{ratio:g}", f"best_{name}": f"`{at.idxmin()[0]}`", f"best_{name}_loss": f"+{at.min() - full['nll']:.3f}",
                   f"worst_{name}": f"`{at.idxmax()[0]}`", f"worst_{name}_loss": f"+{at.max() - full['nll']:.3f}"}
    same = nll[[(press, 0.25) for press in evicted]]
    values |= {"think": f"{nll[('think', 0.5)]:.3f}", "best_quarter": f"`{same.idxmin()[0]}`", "best_quarter_nll": f"{same.min():.3f}"}
    mass = run.head_stats.groupby(["press", "ratio"])["mass_kept"].mean()
    pairs = pd.DataFrame({"mass": mass, "nll": nll}).loc[[(p, r) for p in evicted for r in ratios]]
    rho = pairs["mass"].corr(pairs["nll"], method="spearman")
    values |= {"rho": f"{rho:.2f}", "pairs": str(len(pairs))}
    return Rendered(values, {"knorm-beats-random": all(nll[("knorm", r)] < nll[("random", r)] for r in ratios),
                             "think-worse-at-equal-memory": bool(nll[("think", 0.5)] > same.min()),
                             "mass-orders-presses": bool(rho < -0.7)})


def smollm2_cache_spectral(runs: Runs) -> Rendered:
    """The spectral presses beside snapkv: NLL per ratio, the memory each really saves, and the comparisons the
    presses were built for (loki against snapkv, lowrank against eviction at equal memory, linformer's mixing)."""
    run = only(runs, "cache")
    frame = run.table
    full = frame[frame["press"] == "full"].iloc[0]
    ratios = sorted(set(frame["ratio"]) - {0.0})
    nll = frame.set_index(["press", "ratio"])["nll"]
    linformer = [nll[("linformer", r)] for r in ratios]
    return Rendered({"scored": str(run.meta["scored"]), "context": str(run.meta["context"]),
                     "continuation": str(run.meta["continuation"]), "full_nll": f"{full['nll']:.3f}",
                     "loki_cost": slashed([nll[("loki", r)] - nll[("snapkv", r)] for r in ratios], lambda x: f"{x:+.3f}"),
                     "ratios": slashed(ratios, lambda r: f"{r:g}"),
                     "pca_leverage_worse": str(sum(nll[("pca_leverage", r)] > nll[("snapkv", r)] for r in ratios)),
                     "ratio_count": str(len(ratios)), "linformer": span(linformer, lambda x: f"{x:.1f}"),
                     "linformer_saves": span(frame[frame["press"] == "linformer"]["saved"], two)},
                    {"fitted-on-context": not run.meta.get("calibration", {}).get("used", 0),
                     "lowrank-never-beats-eviction": all(nll[("lowrank", r)] >= nll[("snapkv", r)] for r in ratios),
                     "linformer-far-worse": bool(min(linformer) > full["nll"] + 1)})
