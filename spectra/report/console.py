"""Terminal output shared by the CLI and the Python API: the progress bar and the result tables of each run kind.

Results go to stdout (`out`), the progress bar to stderr (`console`), so a redirected stdout holds tables only.
The numbers printed come from `summaries` and `plan`, the same ones the figures draw.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator

import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from ..config import layers_label
from ..runs import ApproxRun, CacheRun, Run, ScalingRun, TheoremRun
from ..timings import summary
from .plan import Plan
from .summaries import (
    analyze_layers,
    compare_wide,
    gap_closed,
    growth_reading,
    headlines,
    labels_in_order,
    run_keys,
    scaling_fixed,
    scaling_layers,
    theorem1_rows,
    theorem_errors,
    theorem_n,
)


class _Console(Console):
    """A rich console for which a reader that stopped reading (`| head`) ends the output, not the program with
    exit code 1 (rich's own reaction): the CLI treats the BrokenPipeError as a quiet, successful end."""

    def on_broken_pipe(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, (self.file or sys.stdout).fileno())
        raise BrokenPipeError


console = _Console(stderr=True)
out = _Console()


@contextlib.contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """A progress(done, total) callback drawing sequences done, sequences/s and the ETA.

    The bar appears at the first call (so an input error before any work prints only its message)
    and is erased if the block ends with an error.
    """
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} seq/s"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
    )
    task = bar.add_task(description, total=None, rate="–")
    first: list[float] = []

    def update(done: int, total: int) -> None:
        now = bar.get_time()
        if not first:
            first.extend([now, done, done])
            bar.start()
        if done < first[2]:  # a new run on the same bar (spectra scaling: one per length): rate from here
            first[:2] = [now, done]
            bar.reset(task, total=total, rate="–")
        first[2] = done
        rate = (done - first[1]) / (now - first[0]) if now > first[0] and done > first[1] else None
        bar.update(task, completed=done, total=total, rate=f"{rate:.2f}" if rate else "–")

    try:
        yield update
    except BaseException:
        bar.live.transient = True
        raise
    finally:
        if first:
            bar.stop()


# ---------------------------------------------------------------- tables


def column_header(label: str) -> str:
    """A column header: a method's registered short header (linformer(headwise) → lin / (head)), else the
    label with a parenthesis on a second line (svd (floor), a column name without one stays as it is)."""
    from ..methods import REGISTRY  # imports torch: only when a table is printed

    return REGISTRY[label].short if label in REGISTRY else label.replace("(", "\n(")


def frame_table(frame: pd.DataFrame, digits: int | dict[str, int] = 3, missing: str = "") -> Table:
    """A rich table of a DataFrame: floats rounded, NaN shown as `missing`.

    `digits`: decimals for every float column, or a map from column-name substrings to decimals
    (default 3); -1 prints a percentage.
    """
    def cell(column: str, value) -> str:
        if not isinstance(value, float):
            return str(value)
        if math.isnan(value):
            return missing
        places = digits if isinstance(digits, int) else next((d for key, d in digits.items() if key in column), 3)
        return f"{value:.1%}" if places < 0 else f"{value:.{places}f}"

    table = Table()
    for column in frame.columns:
        table.add_column(column_header(str(column)), justify="right")
    for row in frame.itertuples(index=False):
        table.add_row(*(cell(str(column), value) for column, value in zip(frame.columns, row)))
    return table


def print_frame(frame: pd.DataFrame, title: str | None = None, digits: int | dict[str, int] = 3,
                missing: str = "") -> None:
    """Print a DataFrame as a table at its natural width: a terminal wraps long lines, rich would elide cells."""
    if title:
        out.print(title, soft_wrap=True)
    table = frame_table(frame, digits, missing)
    natural = out.measure(table, options=out.options.update(width=10_000)).maximum
    if natural <= out.width:
        out.print(table)
    else:
        _Console(width=natural, file=out.file, color_system=out.color_system).print(table)


# ---------------------------------------------------------------- one printer per run kind


def plural(count: int, noun: str) -> str:
    """'1 sequence', '2 sequences'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


#: what the key-rank columns of the analyze table are: the energy rank, not the variance one (issue 33, item 7)
KEY_RANK_NOTE = ("key rank90 (energy): dimensions of the head holding 90% of the keys' energy Σkᵀk over the run, "
                 "the mean key included (dataset_rank90 in qkv.csv; pca_rank90 there holds 90% of their variance, "
                 "the mean removed)")


def print_analyze(run: Run) -> None:
    """The per-layer summary of an analyze run and where it was written."""
    kind = "decoder, causal P" if run.causal else "encoder"
    heads = run.meta.get("heads")
    over = f"{run.heads} heads" if heads is None else f"heads {layers_label(heads)}"
    print_frame(analyze_layers(run), f"{run.label} ({kind}): n = {run.n}, {plural(run.meta['samples'], 'sequence')}, "
                f"mean over {over} per layer", {"rank": 1, "entropy": 2})
    if run.qkv is not None:
        out.print(f"sink: mean attention of queries to the first token; entropy in nats; {KEY_RANK_NOTE}",
                  soft_wrap=True)
    out.print(f"results written to {run.path}")
    if summary(run.meta.get("timings")):  # where the time went (spectra.timings)
        out.print(summary(run.meta["timings"]), soft_wrap=True)


def print_approx(run: ApproxRun) -> None:
    """The per-layer error table of an approx run (one per budget), the k plan, and the end-to-end lines."""
    per_layer = run.per_layer("out_err")
    medians = run.per_layer("out_err", "median")["out_err"].to_numpy()
    cells = [f"{mean:.3f} ({median:.3f})" for mean, median in zip(per_layer["out_err"], medians)]
    methods = labels_in_order(per_layer)
    for budget, rows in per_layer.assign(cell=cells).groupby("budget", sort=True):
        wide = rows.pivot(index="layer", columns="method", values="cell")[methods].reset_index()
        print_frame(wide, f"{run.label}, k = {budget}: relative head-output error ‖PV − Ṽ‖/‖PV‖, mean (median) over "
                    "sequences, averaged over heads")
    if any(label.startswith("linformer(") for label in methods):
        out.print("lin(s) = linformer with sharing s: none, head(wise), kv, layer(wise)")
    if len(run.meta["budget"]) > 1:
        plan = run.k_needed().pivot(index="layer", columns="method", values="k_needed")[methods].reset_index()
        print_frame(plan, f"smallest k in the sweep with mean error ≤ {run.meta['target']} per layer", digits=0,
                    missing="—")
    print_stand_in(run)
    if run.end_to_end is not None:
        layers = run.end_to_end["layers"].iloc[0]
        out.print(f"end to end ({'all layers' if layers == 'all' else 'layers ' + layers} substituted):")
        for row in run.end_to_end.itertuples(index=False):
            allocation = getattr(row, "allocation", None)
            where = f"k={row.budget}" if allocation in (None, "uniform") else f"k plan (mean k={row.budget})"
            line = f"  {row.method}, {where}: hidden drift {row.hidden_rel_err:.3f}, cosine {row.cosine:.3f}"
            if "ppl" in run.end_to_end.columns:
                line += f", ppl {row.ppl_exact:.3g} → {row.ppl:.3g} ({row.ppl_change:+.0%})"
            out.print(line, soft_wrap=True)


def print_stand_in(run: ApproxRun) -> None:
    """For runs with fitted methods or a k plan: held-out against calibration errors, the fraction of the gap
    between a random projection and the SVD oracle each method closes, and plan against uniform k."""
    if run.calibration is not None:
        held = run.per_layer("out_err")
        fitted = held[held["method"].isin(run.meta.get("calibration", {}).get("fitted", []))]
        calibration = run.per_layer("out_err", table="calibration").set_index(["method", "budget", "layer"])
        rows = fitted.assign(calibration=[calibration["out_err"].get(key, float("nan")) for key in
                                          zip(fitted["method"], fitted["budget"], fitted["layer"])])
        rows = rows.groupby(["method", "budget"], sort=False)[["calibration", "out_err"]].mean().reset_index()
        print_frame(rows.rename(columns={"out_err": "held out"}), "fitted methods: mean head-output error over "
                    "layers, on the calibration sequences and on the held-out ones (the gap is overfitting)")
        gap = gap_closed(run)
        for budget, part in gap.groupby("budget", sort=True):
            wide = part.pivot(index="layer", columns="method", values="gap_closed")
            wide = wide[labels_in_order(part)].reset_index()
            print_frame(wide, f"k = {budget}: fraction of the gap between the random projection (same sharing, else "
                        "jl) and the SVD oracle closed, (random − method)/(random − svd)", {"": 2})
    if run.plan is not None:
        plan = run.per_layer("out_err", table="plan").rename(columns={"out_err": "plan", "budget": "k (plan)"})
        uniform = run.per_layer("out_err").rename(columns={"out_err": "uniform", "budget": "k (uniform)"})
        both = plan.merge(uniform, on=["method", "layer"])
        print_frame(both[["method", "layer", "k (plan)", "plan", "k (uniform)", "uniform"]],
                    "k plan against a uniform k of equal total cost Σ n·k: mean head-output error per layer")


def theorem_column(label: str) -> str:
    """The terminal's name for a `theorem_errors` label: svd is the floor, Theorem 2's δ variants are short."""
    if label == "svd":
        return "svd (floor)"
    if label.startswith("theorem2(") and label.endswith(")"):
        return "thm2 " + label[len("theorem2("):-1].replace("delta=", "δ=")
    return label


def print_theorems(run: TheoremRun) -> None:
    """Pooled over layers and heads: Pr(error ≤ ε) against the bound per k, and the errors per method."""
    two = run.tables["theorem2"]
    for form, wording in (("output", "Pr(‖P̃w − Pw‖ ≤ ε‖Pw‖), the statement"),
                          ("rows", "Pr(every |(P̃w − Pw)_i| ≤ ε‖P_i‖‖w‖), the event its proof bounds")):
        jl = theorem1_rows(run, form)
        jl = jl[jl["method"] == "jl"]
        if not len(jl):
            continue
        interval = "pr_low" in jl.columns
        cells = [f"{p:.3f}" + (f" [{low:.3f}, {high:.3f}]" if interval else "") + f" ({b:.3f})"
                 for p, b, low, high in zip(jl["pr"], jl["bound"], jl.get("pr_low", jl["pr"]), jl.get("pr_high", jl["pr"]))]
        table = jl.assign(cell=cells).pivot(index="budget", columns="eps", values="cell").reset_index()
        table.columns = ["k"] + [f"ε={e:g}" for e in table.columns[1:]]
        draws = int(jl["draws"].iloc[0]) if "draws" in jl.columns else 0
        source = (f"a fresh R per sequence ({plural(draws, 'draw')} each)" if draws else "one R per layer and k (fixed)")
        print_frame(table, f"{run.label}, n = {theorem_n(run)}: Theorem 1, P̃ = P RᵀR, {source} — empirical {wording}"
                    + (" [95% interval over sequences]" if interval else "") + " (bound)")
    jl = theorem1_rows(run, "output")
    jl = jl[jl["method"] == "jl"]
    needed = ", ".join(f"ε={e:g}: {k:.0f}" for e, k in jl.groupby("eps")["k_theory"].first().items())
    out.print(f"Theorem 1's k = 5 ln n/(ε²−ε³): {needed}", soft_wrap=True)
    pooled = theorem_errors(run, "output")
    pooled["label"] = pooled["label"].map(theorem_column)
    for stat in ("median", "p95"):
        wide = pooled.pivot(index="budget", columns="label", values=stat)
        wide = wide[labels_in_order(pooled, "label")].reset_index().rename(columns={"budget": "k"})
        print_frame(wide, f"{stat} relative error per column w (jl, svd) or per row (linformer, Theorem 2 "
                    "relative to ‖softmax(w)V‖)")
    rhs = two[(two["method"] == "theorem2") & (two["relative_to"] == "rhs")]
    if len(rhs):
        k2 = ", ".join(f"ε={e:g}: {k:.0f}" for e, k in rhs.groupby("eps")["k_theory"].first().items())
        out.print("Theorem 2 relative to its right side ‖softmax(w)‖‖V‖_F, median (largest over δ): "
                  + ", ".join(f"k={k}: {m:.3g}" for k, m in rhs.drop_duplicates(["variant", "budget"])
                              .groupby("budget")["median"].max().items())
                  + f"; its k = min(9d ln d, 5 ln n)/ε²: {k2}", soft_wrap=True)


def print_plan(run: Run, plan: Plan) -> None:
    """A k plan per layer (or head) and its cost against uniform and full attention."""
    rule = "the largest of its heads' budget" if plan.per_head else f"from the mean curve of its {run.heads} heads"
    print_frame(plan.by_layer(), f"{run.label}, n = {run.n}: smallest budget whose mean normalized cumulative "
                f"singular value reaches E = {plan.energy:g}, rounded up to a multiple of {plan.multiple} "
                f"(a layer's budget: {rule})")
    print_frame(plan.costs(), "Attention " + plan.caption(), {"plan_share": -1, "saved": -1})
    out.print(RANK_VS_PLAN, soft_wrap=True)


#: why plan-k's k_min is not analyze's rank90 (the README says the same, tests/report/test_plan.py checks it)
RANK_VS_PLAN = ("k_min is not analyze's rank90: rank90 is the mean over sequences of each sequence's own smallest k "
                "reaching 90%, k_min the smallest k where the mean curve (over sequences, and heads unless --per-head) "
                "reaches E; neither bounds the other, and both lie between the smallest and the largest per-sequence "
                "rank.")


def print_compare(runs: list[Run], table: pd.DataFrame, at: int | None) -> None:
    """Several analyze runs side by side (`table` is `summaries.compare(runs, at)`): per layer, then per run."""
    summary = headlines(runs, at)
    keys = run_keys(len(runs))
    for key, run in zip(keys, runs):
        out.print(f"{key}  {run.label}, n = {run.n}, {plural(run.meta.get('samples', 0), 'sequence')}: {run.path}")
    print_frame(compare_wide(table), "Per layer, mean over heads: c at the index and the rank needed for 90% of the "
                "nuclear norm", {"rank": 1})
    summary = summary.drop(columns=["run"]).rename(columns={"c_min": "c min", "c_max": "c max", "c_mean": "c mean",
                                                           "layer_rho": "rho", "sequences": "seqs"})
    print_frame(summary.assign(run=keys)[["run", *summary.columns]],
                "Per run, over every layer × head: c at the index (min, max, mean), Spearman rho between layer index "
                "and per-layer mean c (positive: higher layers lower rank), mean rank for 90%", {"rank": 1, "rho": 2})


def print_scaling(run: ScalingRun) -> None:
    """The rank for 90% per layer and n with its growth exponent, c at fixed k per n, what the pooled α says
    about the paper's claim, and with a target the k needed per n."""
    heads = run.meta["settings"]["extra"]
    where = "" if heads["heads"] == "all" and heads["layers"] == "all" else \
        f" (layers {heads['layers']}, heads {heads['heads']})"
    print_frame(scaling_layers(run, "rank90"),
                f"{run.label}{where}, {plural(run.meta['samples'], 'sequence')} per n: rank holding 90% of P's nuclear "
                "norm, mean over heads; α fits rank ∝ n^α", {"α": 2, "n=": 1})
    print_frame(scaling_fixed(run), "c at a fixed k and at k = n/4 (mean over heads): steady across n when that k "
                "keeps up with longer sequences", missing="—")
    pooled = run.exponents[(run.exponents["scope"] == "pooled") & (run.exponents["method"] == "")].set_index("metric")
    for metric, share in (("rank90", "90%"), ("rank99", "99%")):
        row = pooled.loc[metric]
        out.print(f"rank for {share}: {growth_reading(row['alpha'], row['alpha_low'], row['alpha_high'])}",
                  soft_wrap=True)
    if run.k_needed is not None:
        pooled_k = run.k_needed[run.k_needed["layer"].isna()]
        wide = pooled_k.pivot(index="method", columns="n", values="k_needed")
        wide.columns = [f"n={n}" for n in wide.columns]
        fits = run.exponents[run.exponents["metric"] == "k_needed"].set_index("method")
        wide["α"] = fits["alpha"]
        print_frame(wide.reset_index(), f"smallest k (of those tried) whose mean head-output error over layers is ≤ "
                    f"{run.meta['target']}", {"n=": 0, "α": 2}, missing="—")


def print_cache(run: CacheRun) -> None:
    """Per press and ratio: NLL, perplexity, KL from the full cache, top-1 agreement, tokens kept, memory saved."""
    meta = run.meta
    columns = ["press", "ratio", "nll", "ppl", "kl", "top1", "kept", "saved"]
    table = run.table[columns]
    if (run.table["key_channel_ratio"] > 0).any():
        table = table.assign(channels=run.table["key_channel_ratio"])
    print_frame(table, f"{run.label}: context {meta['context']}, continuation {meta['continuation']}, "
                f"{plural(meta.get('scored', meta.get('samples', 0)), 'sequence')}; NLL (nats/token) of the continuation "
                "against each compressed cache, KL from the full cache's next-token distribution, top-1 agreement",
                digits={"ratio": 2, "nll": 4, "ppl": 3, "kl": 4, "top1": 3, "kept": 1, "saved": 3, "channels": 2})
    if meta.get("skipped"):
        out.print(f"{plural(meta['skipped'], 'sequence')} shorter than context + continuation skipped")
