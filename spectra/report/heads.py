"""The read side of `spectra heads`: its run object (`HeadsRun`), what it prints and its figures.

Views of a heads run: the rank the weights allow against the rank the attention uses, the heads' types on a
layer × head grid and, joined with an approx run, the winning method on the same grid (a panel per budget).

Artists carry gids the tests read back: the scatter of each panel "qk" / "ov" (offsets: weight rank90, attention
rank90 per head, in diagnosis order), the grids "types" and "winners:<budget>" (cell values: the index of the
head's type in `HEAD_TYPES`, or of its winner in the panel's legend order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..anatomy.methodmap import HEAD_TYPES
from ..runs import FinishedRun, read_arrays, read_table
from .console import out, print_frame
from .plots import (
    style,  # style.save, looked up at call time: the one name tests patch to record figures
)
from .plots.style import method_style, plot_folder, pyplot, subtitle, ticks

if TYPE_CHECKING:  # pandas is imported where a table is read: the command line's start does not pay for it
    import pandas as pd

@dataclass(repr=False)
class HeadsRun(FinishedRun):
    """A `spectra heads` run loaded back.

    `diagnosis`: one row per (layer, head) with every score (see `spectra.anatomy.diagnosis`), the weight ranks and the head
    type; `weights`: σ and normalized cumulative curves of W_QK and W_OV (layers, heads, d), when the linears were
    found; `kv_heads` and `full_attention_heads` (DuoAttention's pattern: layers × KV heads) when the retrieval score
    was measured; `method_map` and `rules` when the run was joined with an approx run.
    """

    path: Path
    meta: dict[str, Any]
    diagnosis: pd.DataFrame
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    kv_heads: pd.DataFrame | None = None
    full_attention_heads: np.ndarray | None = None
    method_map: pd.DataFrame | None = None
    rules: pd.DataFrame | None = None

    def _held(self) -> dict[str, Any]:
        return {"diagnosis": self.diagnosis, **self.weights, "kv_heads": self.kv_heads,
                "full_attention_heads": self.full_attention_heads, "method_map": self.method_map}


    @property
    def layers(self) -> int:
        return int(self.meta["model"]["layers"])

    @property
    def heads(self) -> int:
        return int(self.meta["model"]["heads"])

    @property
    def n(self) -> int:
        return int(self.meta["n"])


def load(path: Path, meta: dict[str, Any]) -> HeadsRun:
    """A heads run directory read back."""
    weights = read_arrays(path / "weights.npz") if (path / "weights.npz").exists() else {}
    tsv = path / "full_attention_heads.tsv"
    full = np.loadtxt(tsv, delimiter="\t", ndmin=2) if tsv.exists() else None
    return HeadsRun(path, meta, read_table(path, "diagnosis.csv"), weights,
                    read_table(path, "kv_heads.csv", optional=True), full,
                    read_table(path, "method_map.csv", optional=True), read_table(path, "rules.csv", optional=True))

#: the per-head diagnosis columns `--all` prints
DIAGNOSIS = ["layer", "head", "head_type", "sink_share", "sink_mean", "prev", "local", "induction_score", "retrieval",
             "top10", "keynorm_corr", "entropy", "rank90", "qk_rank90", "ov_rank90"]
#: the scores whose strongest heads the summary names (each defines a head type, `methodmap.head_types`)
STRONGEST = ["sink_share", "prev", "local", "induction_score", "retrieval"]
#: a head type's column in the per-layer summary (narrow enough for 80 columns)
TYPE_COLUMNS = {"previous-token": "prev"}


def types_per_layer(run: HeadsRun) -> pd.DataFrame:
    """Per layer: how many of its heads are of each type (`HEAD_TYPES` order, previous-token as 'prev') and the mean
    rank90 of P over its heads."""
    table = run.diagnosis
    counts = table.groupby(["layer", "head_type"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=list(HEAD_TYPES), fill_value=0).rename(columns=TYPE_COLUMNS)
    counts["rank90"] = table.groupby("layer")["rank90"].mean()
    return counts.reset_index().rename_axis(columns=None)


def strongest(run: HeadsRun, count: int = 3) -> pd.DataFrame:
    """Per score of `STRONGEST` that the run measured: the `count` heads scoring highest ('L12H3 0.98', ties in
    layer and head order)."""
    import pandas as pd

    table = run.diagnosis
    rows = []
    for score in (score for score in STRONGEST if score in table and table[score].notna().any()):
        top = table.dropna(subset=[score]).sort_values(score, ascending=False, kind="stable").head(count)
        rows.append({"score": score, "strongest heads": ", ".join(
            f"L{row.layer}H{row.head} {getattr(row, score):.2f}" for row in top.itertuples(index=False))})
    return pd.DataFrame(rows, columns=["score", "strongest heads"])


def show(run: HeadsRun, every: bool = False) -> None:
    """The head types per layer and each score's strongest heads (`every`: the whole per-head diagnosis), the type
    counts, the DuoAttention pattern and the method map."""
    table = run.diagnosis
    if every:
        print_frame(table[[name for name in DIAGNOSIS if name in table]], f"{run.label}, n = {run.n}: per-head "
                    "diagnosis", {"rank": 1, "entropy": 2})
    else:
        print_frame(types_per_layer(run), f"{run.label}, n = {run.n}: per layer, how many of its {run.heads} heads "
                    "are of each type (prev: previous-token), and the mean rank90 of P", {"rank": 1})
        print_frame(strongest(run), "the three heads scoring highest on each score (L<layer>H<head>); diagnosis.csv "
                    "holds every score of every head, --all prints them")
    counts = table["head_type"].value_counts()
    out.print("head types: " + ", ".join(f"{name} {count}" for name, count in counts.items()))
    if "induction" in run.meta:
        out.print(f"induction score {run.meta['induction']}")
    if run.full_attention_heads is not None:
        out.print(f"full_attention_heads.tsv: {int(run.full_attention_heads.sum())} of "
                  f"{run.full_attention_heads.size} key/value heads at full attention "
                  f"(--duo-share {run.meta['duo_share']}), streaming {run.meta['sinks']} sinks + "
                  f"{run.meta['recent']} recent tokens")
    if run.rules is not None and not run.rules.empty:
        for rule in run.rules.itertuples(index=False):  # rules.csv holds the tree's lines joined by " | "
            out.print(f"k = {rule.budget}: winner rule, accuracy {rule.accuracy:.0%}, held out "
                      f"{rule.held_out_accuracy:.0%} (always {rule.baseline_winner}: {rule.baseline:.0%}):")
            for line in str(rule.rule).split(" | "):
                out.print(f"  {line}")


#: one colour per head type, in HEAD_TYPES order (mixed in grey): Okabe and Ito's colour-blind-safe set, every pair
#: apart for the three kinds of dichromacy (red and green, for sink and local, were one colour to many readers)
TYPE_COLORS = ("#CC79A7", "#56B4E9", "#0072B2", "#F0E442", "#D55E00", "0.8")


def heads_subtitle(run: HeadsRun) -> str:
    return subtitle(run, run.n)


def draw_weight_ranks(run: HeadsRun):
    """Per head, rank90 of P (the rank the data uses, y) against rank90 of W_QK and of W_OV (the rank the weights
    allow, x; ≤ the head dimension): a panel each, points coloured by layer, the diagonal dashed. The legend (the
    same two reference lines in both panels) sits below the panels: inside, upper left, it hid the heads with a
    low weight rank and a high attention rank (MiniLM's L0H2 at (22, 115)), the most notable ones."""
    plt = pyplot()
    table = run.diagnosis
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.8), sharey=True, layout="constrained")
    colors = plt.get_cmap("viridis")(table["layer"].to_numpy() / max(run.layers - 1, 1))
    for ax, name, title in zip(axes, ("qk", "ov"), ("W_QK = W_Q,hᵀ W_K,g", "W_OV = W_O,h W_V,g")):
        x, y = table[f"{name}_rank90"].to_numpy(float), table["rank90"].to_numpy(float)
        ax.scatter(x, y, c=colors, s=22, edgecolor="none", gid=name)
        d = run.weights[f"{name}_sigma"].shape[-1] if f"{name}_sigma" in run.weights else np.nanmax(x)
        ax.plot([0, d], [0, d], color="0.4", linestyle="--", linewidth=1, gid=f"{name}:diagonal", label="y = x")
        ax.axvline(d, color="0.6", linestyle=":", linewidth=1, label=f"head dimension d = {d}")
        ax.set_xlim(0, d * 1.08)
        ax.set_xlabel(f"rank90 of {title} (weights)")
        ax.set_title(f"{title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("rank90 of P (attention, mean over sequences)")
    mappable = plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(0, max(run.layers - 1, 1)))
    figure.colorbar(mappable, ax=list(axes), label="layer")
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, frameon=False)
    figure.suptitle(f"Rank the weights allow vs rank the attention uses\n{heads_subtitle(run)}")
    return figure


def _grid(run: HeadsRun, values: np.ndarray) -> np.ndarray:
    grid = np.full((run.layers, run.heads), np.nan)
    table = run.diagnosis
    grid[table["layer"].to_numpy(int), table["head"].to_numpy(int)] = values
    return grid


def _categorical(ax, grid: np.ndarray, colors: list, gid: str) -> None:
    """A layer × head grid of category indices (NaN: not measured) in the given colours."""
    from matplotlib.colors import ListedColormap

    ax.imshow(grid, cmap=ListedColormap(colors), vmin=-0.5, vmax=len(colors) - 0.5, aspect="auto",
              interpolation="nearest", gid=gid)
    layers, heads = grid.shape
    ax.set_xticks(ticks(heads))
    ax.set_yticks(ticks(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")


def _legend(figure, colors: list, labels: list[str], present: set[int]) -> None:
    """One legend for the figure, right of its panels: the categories that occur."""
    from matplotlib.patches import Patch

    shown = sorted(present)
    figure.legend([Patch(color=colors[i]) for i in shown], [labels[i] for i in shown], loc="outside right upper",
                  fontsize=8)


def draw_head_types(run: HeadsRun):
    """The layer × head grid coloured by head type (`methodmap.head_types`; thresholds in its docstring)."""
    plt = pyplot()
    table = run.diagnosis
    values = table["head_type"].map({name: i for i, name in enumerate(HEAD_TYPES)}).to_numpy(float)
    figure, ax = plt.subplots(figsize=(0.35 * run.heads + 3.5, 0.3 * run.layers + 1.8), layout="constrained")
    _categorical(ax, _grid(run, values), list(TYPE_COLORS), "types")
    _legend(figure, list(TYPE_COLORS), list(HEAD_TYPES), {int(v) for v in values})
    ax.set_title(f"Head types\n{heads_subtitle(run)}")
    return figure


def draw_winners(run: HeadsRun):
    """The layer × head grid coloured by the method with the smallest mean output error, a panel per budget."""
    plt = pyplot()
    mapped = run.method_map
    budgets = sorted(mapped["budget"].unique())
    methods = sorted(mapped["winner"].unique())
    colors = [method_style(label, i)["color"] for i, label in enumerate(methods)]
    figure, axes = plt.subplots(1, len(budgets), figsize=(len(budgets) * (0.3 * run.heads + 2) + 2,
                                                          0.3 * run.layers + 1.8), squeeze=False, layout="constrained")
    for ax, budget in zip(axes[0], budgets):
        rows = mapped[mapped["budget"] == budget]
        grid = np.full((run.layers, run.heads), np.nan)
        grid[rows["layer"].to_numpy(int), rows["head"].to_numpy(int)] = rows["winner"].map(methods.index)
        _categorical(ax, grid, colors, f"winners:{budget}")
        rule = run.rules[run.rules["budget"] == budget].iloc[0] if run.rules is not None else None
        held = (f"\nrule: {rule['held_out_accuracy']:.0%} held out, always {rule['baseline_winner']}: "
                f"{rule['baseline']:.0%}" if rule is not None else "")
        ax.set_title(f"k = {budget}{held}")
    _legend(figure, colors, methods, set(range(len(methods))))
    figure.suptitle(f"Winning method per head (smallest ‖PV − P̃V‖/‖PV‖)\n{heads_subtitle(run)}")
    return figure


def plot_heads(run: HeadsRun, out: str | Path | None = None) -> list[Path]:
    """weight_vs_attention_rank, head_types and (joined with an approx run) winners, as PNG and PDF."""
    folder = plot_folder(run, out)
    paths = []
    if np.isfinite(run.diagnosis["qk_rank90"].to_numpy(float)).any():
        paths += style.save(draw_weight_ranks(run), folder / "weight_vs_attention_rank")
    paths += style.save(draw_head_types(run), folder / "head_types")
    if run.method_map is not None and not run.method_map.empty:
        paths += style.save(draw_winners(run), folder / "winners")
    return paths


def plot(run: HeadsRun, out: str | Path | None = None) -> list[Path]:
    return plot_heads(run, out)
