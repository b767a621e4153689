"""The bridge from a head's spectrum to what a press can take from it: does what an `analyze` (or `heads`) run measured
of a key/value head's attention predict how much of the needle a press keeps there, and does a budget set from the
spectrum alone (`headbudget(DIR@rank)`) beat AdaKV's at the same bytes?

`join` lines up, per (layer, key/value head), the spectrum measures of one model (`MEASURES`: c at the run's index
— n/4 by default —, the rank of P for 90% of its nuclear norm, the attention's entropy and sink mass, each the mean
over the key/value head's query heads as `anatomy.headweights` forms a budget's weights; and the rank of the head's
keys for 90% of their energy before and after RoPE, qkv.csv's projection and attention stages) beside what task
runs of the same model recorded per press and ratio (needle.npz: per question asked, layer and key/value head, the
share of the needle's tokens the cache kept). A run of another model, or of other layer or head counts, is refused in
one line. The questions kept are those the full cache answered (or, `over`, every question of the held tasks, or
every one) whose record hides a needle; a head that the press did not compress (its share of rows kept equals the
full cache's: a sliding-window layer keeps its window whatever the press) says nothing of what the press can take,
and is left out of the correlations.

Survival only, no "score lost per head": an example's score is the answer of every head together, and nothing in a
run says which head's evictions cost it — that would take one evaluation per head and example with only that head
compressed. Attributing the example's loss to heads by their survival would be the correlation itself, assumed.

`correlations`: per press, ratio and measure, Spearman's ρ over the compressed heads between the measure and the
head's mean survival, with a 95% percentile interval. What is resampled is what is independent: the questions (their
records), with the leaderboard's task-stratified paired Poisson bootstrap (`ranks.replicates`: a record's weights
depend on its index only, so every head, press and ratio sees the same replicate). The heads are not resampled: a
model's heads are the whole population the question is about, not a sample of one, and neighbouring heads of a layer
share their inputs, so treating them as independent draws would give intervals for a question nobody asked. The
measures are held fixed (the analyze run's means over its sequences); the interval is the spread that comes from
which needles the task run asked about. A replicate in which every head kept the same share (ρ undefined) is
dropped; `replicates` says how many were used.

`budget_comparison`: per ratio, a press's score against each reference press's on the same examples, the paired
difference with its interval (the same bootstrap), and whether every example stored the same bytes in both cells.
`draw`: the correlations as one heatmap, measures down and press × ratio across.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..anatomy.headweights import by_head, group_means
from ..errors import SpectraError
from ..kv.tasks.summary import LEVEL, REPLICATES
from ..runs import read_table
from . import leaderboard, ranks
from .published import PUBLISHED, SUFFIX
from .plots import style

if TYPE_CHECKING:
    from ..runs import FinishedRun
    from .evaluate import TaskRun

#: measure → (table, column, what it is): metrics.csv per query head (averaged over each key/value head's query
#: heads), qkv.csv's keys per key/value head at a stage
MEASURES = {
    "c_at": ("metrics.csv", "c_at_mean", "c at the run's index i (c@i; i = n/4 by default)"),
    "rank90": ("metrics.csv", "rank90_mean", "rank of P for 90% of its nuclear norm"),
    "entropy": ("metrics.csv", "entropy_mean", "entropy of the attention rows"),
    "sink": ("metrics.csv", "sink_mean", "attention mass on the first key"),
    "key_rank90_before_rope": ("qkv.csv", "projection", "rank of K for 90% of its energy before RoPE"),
    "key_rank90_after_rope": ("qkv.csv", "attention", "rank of K for 90% of its energy after RoPE"),
}
#: the model facts two runs must share for their heads to be the same heads
SAME = ("name", "layers", "heads", "kv_heads")
#: the press the budget comparison measures by default against its references
REFERENCES = ("adakv(snapkv)", "snapkv")


@dataclass(frozen=True)
class Bridge:
    """Per (layer, key/value head) the spectrum `measures`; per compressing cell (press, ratio) of the task runs the
    needle's `survival` (cells, questions, layers, heads) on the questions chosen (`records`: each one's example,
    `tasks`: its task), and which heads the cell `compressed` (cells, layers, heads)."""

    measures: pd.DataFrame
    cells: list[tuple[str, float]]
    survival: np.ndarray
    records: np.ndarray
    tasks: np.ndarray
    compressed: np.ndarray
    seed: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.survival.shape[2], self.survival.shape[3]

    def measure(self, name: str) -> np.ndarray:
        """(layers, heads) of one measure."""
        return self.measures[name].to_numpy(dtype=np.float64).reshape(self.shape)


def model_of(run: FinishedRun) -> dict[str, object]:
    """The run's model facts that name its heads (`SAME`)."""
    model = run.meta.get("model", {})
    return {key: model.get("kv_heads") or model.get("heads") if key == "kv_heads" else model.get(key) for key in SAME}


def spectrum_measures(run: FinishedRun) -> pd.DataFrame:
    """Per (layer, key/value head) of an analyze or heads run: the `MEASURES` its tables hold (a heads run has no
    qkv.csv, a model without RoPE no stage before it: those columns are absent)."""
    if run.meta.get("kind") not in ("analyze", "heads"):
        raise SpectraError(f"{run.path} is a {run.meta.get('kind')} run: the spectrum measures come from an analyze or "
                           "heads run of the model")
    facts = model_of(run)
    heads, kv_heads, layers = int(facts["heads"] or 0), int(facts["kv_heads"] or 0), int(facts["layers"] or 0)
    gz = SUFFIX if PUBLISHED in run.meta else ""  # a published analyze run: its files were checked when it loaded
    metrics = read_table(run.path, "metrics.csv" + gz)
    qkv = read_table(run.path, "qkv.csv" + gz, optional=True)
    found: dict[str, np.ndarray] = {}
    for name, (table, column, _) in MEASURES.items():
        if table == "metrics.csv" and column in metrics:
            values = by_head(metrics, column, heads, kv_heads)
            if values is None or len(values) != layers:
                raise SpectraError(f"{run.path}/metrics.csv does not hold every one of the model's {layers} layers × "
                                   f"{heads} heads (a run over some layers or heads only): the bridge reads them all")
            found[name] = group_means(values, kv_heads)
        elif table == "qkv.csv" and qkv is not None:
            stage = column if column == "attention" or (qkv["stage"] == column).any() else "attention"
            if column == "attention" and not run.meta.get("rope", False):
                continue  # no rotation: the attention stage is the keys before RoPE, listed once
            keys = qkv[(qkv["tensor"] == "k") & (qkv["stage"] == stage)]
            grid = keys.pivot_table(index="layer", columns="head", values="rank90_mean")
            if grid.shape == (layers, kv_heads):
                found[name] = grid.sort_index(axis=0).sort_index(axis=1).to_numpy(dtype=np.float64)
    layer, head = np.meshgrid(np.arange(layers), np.arange(kv_heads), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                         **{name: values.ravel() for name, values in found.items()}})


def join(analysis: FinishedRun, runs: Sequence[TaskRun], over: str = "answered",
         holds: float = leaderboard.HOLDS) -> Bridge:
    """The `Bridge` of an analyze or heads run and task runs of the same model (pooled as the leaderboard pools
    them), over the questions `over` chooses (`leaderboard.FILTERS`: "answered", the default, the questions the full
    cache answered) that hide a needle. One line where the models differ, a task run has no needle.npz, or no
    question is left."""
    runs = list(runs)
    mine = model_of(analysis)
    for run in runs:
        theirs = model_of(run)
        differ = [key for key in SAME if mine[key] != theirs[key]]
        if differ:
            raise SpectraError(f"{analysis.path} and {run.path} ran different models ({', '.join(differ)}: "
                               f"{', '.join(str(mine[key]) for key in differ)} vs "
                               f"{', '.join(str(theirs[key]) for key in differ)}): bridge runs of one model")
    measures = spectrum_measures(analysis)
    rows = leaderboard.chosen(leaderboard.pooled(runs), holds, over)
    unit = ranks.units(rows)
    chosen = rows[rows["press"] == "full"].drop_duplicates(unit).set_index(unit)
    cells, blocks, needle = [], [], None
    for run in runs:
        arrays = run.arrays()
        items = pd.MultiIndex.from_arrays([arrays["example"], arrays.get("question", np.zeros_like(arrays["example"]))])
        where = items.get_indexer(chosen.index if len(unit) > 1 else
                                  pd.MultiIndex.from_arrays([chosen.index, np.zeros(len(chosen), int)]))
        if (where < 0).any():
            raise SpectraError(f"{run.path}'s needle.npz lacks questions its task_examples.csv scores: the run "
                               "directory is incomplete")
        survival = arrays["survival"][:, where]
        for index, (press, ratio) in enumerate(zip(arrays["press"], arrays["ratio"])):
            if press == "full":
                needle = np.isfinite(survival[index]).all(axis=(1, 2)) if needle is None else needle
            elif np.isfinite(survival[index]).any():  # a transform keeps no context positions: no survival
                cells.append((str(press), float(ratio)))
                blocks.append(survival[index])
    if needle is None or not needle.any() or not cells:
        raise SpectraError(f"no question hides a needle that a press evicted from among {leaderboard.FILTERS[over]}: "
                           "nothing to bridge")
    kept = leaderboard.pooled_needle(runs).set_index(["press", "ratio", "layer", "head"])["kept"].sort_index()
    layers, heads = blocks[0].shape[1:]
    full = kept.loc[("full", 0.0)].to_numpy().reshape(layers, heads)
    compressed = np.stack([kept.loc[cell].to_numpy().reshape(layers, heads) < full - 1e-12
                           for cell in cells])
    return Bridge(measures, cells, np.stack(blocks)[:, needle], chosen.index.get_level_values("example")
                  .to_numpy()[needle], chosen["task"].to_numpy()[needle], compressed, leaderboard.seed_of(runs))


def table(bridge: Bridge) -> pd.DataFrame:
    """Per press, ratio, layer and key/value head: the measures, `survival` (the needle's mean share kept over the
    questions chosen) and `compressed` (whether the press compressed the head)."""
    parts = []
    for index, (press, ratio) in enumerate(bridge.cells):
        parts.append(bridge.measures.assign(press=press, ratio=ratio,
                                            survival=bridge.survival[index].mean(axis=0).ravel(),
                                            compressed=bridge.compressed[index].ravel()))
    frame = pd.concat(parts, ignore_index=True)
    return frame[["press", "ratio", *bridge.measures.columns, "survival", "compressed"]]


def spearman_rows(measure: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Spearman's ρ between `measure` (heads,) and each row of `values` (rows, heads): Pearson's r of the average
    ranks; NaN where either side is constant."""
    from scipy.stats import rankdata

    x = rankdata(measure)
    y = rankdata(values, axis=1)
    x, y = x - x.mean(), y - y.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (y @ x) / np.sqrt((y * y).sum(axis=1) * (x @ x))


def correlations(bridge: Bridge, level: float = LEVEL, count: int = REPLICATES) -> pd.DataFrame:
    """Per press, ratio and measure: `heads` (the compressed ones correlated), `rho` (Spearman's ρ between the
    measure and the head's mean survival), `low`, `high` (its percentile interval over the bootstrap's replicates of
    the questions) and `replicates` (those in which ρ is defined)."""
    rows = []
    names = [name for name in MEASURES if name in bridge.measures]
    for index, (press, ratio) in enumerate(bridge.cells):
        mask = bridge.compressed[index].ravel()
        values = bridge.survival[index].reshape(len(bridge.records), -1)[:, mask]
        scores = ranks.Scores(values, list(range(values.shape[1])), bridge.records, bridge.tasks,
                              np.full(values.shape[1], np.nan))
        boot = ranks.replicates(scores, bridge.seed, count)
        for name in names:
            measure = bridge.measure(name).ravel()[mask]
            rho = spearman_rows(measure, values.mean(axis=0, keepdims=True))[0]
            spread = spearman_rows(measure, boot)
            spread = spread[np.isfinite(spread)]
            low, high = ranks.percentile(spread[:, None], level) if len(spread) else ([np.nan], [np.nan])
            rows.append({"press": press, "ratio": ratio, "measure": name, "heads": int(mask.sum()), "rho": rho,
                         "low": float(low[0]), "high": float(high[0]), "replicates": len(spread)})
    return pd.DataFrame(rows, columns=["press", "ratio", "measure", "heads", "rho", "low", "high", "replicates"])


def budget_comparison(rows: pd.DataFrame, press: str, references: Sequence[str] = REFERENCES, seed: int = 0,
                      level: float = LEVEL) -> pd.DataFrame:
    """Per ratio `press` ran and reference press of `references` that ran there too, over the examples of `rows`
    (task runs' per-example rows, `leaderboard.pooled`, chosen as the caller likes): `examples`, the two scores,
    `delta` = press − reference with its paired interval (`ranks.replicates`), each cell's mean `bytes_share`, and
    `same_bytes`: whether every example stored the same bytes in both cells. One line where `press` is not in the
    rows or no reference ran at its ratios."""
    ran = rows[rows["press"] == press]
    if ran.empty:
        raise SpectraError(f"{press} is not among the runs' presses ({', '.join(dict.fromkeys(rows['press']))}): "
                           "name one they ran")
    cells = [(press, ratio) for ratio in dict.fromkeys(ran["ratio"])]
    pairs = [((press, ratio), (other, ratio)) for _, ratio in cells for other in references
             if ((rows["press"] == other) & (rows["ratio"] == ratio)).any()]
    if not pairs:
        raise SpectraError(f"none of {', '.join(references)} ran at {press}'s ratios: compare presses of one grid")
    wanted = set(cells) | {pair[1] for pair in pairs}
    picked = rows[[cell in wanted for cell in zip(rows["press"], rows["ratio"])]]
    scores = ranks.scores(picked, ["press", "ratio"])
    boot = ranks.replicates(scores, seed)
    stored = picked.set_index([*ranks.units(picked), "press", "ratio"])
    column = "bytes" if "bytes" in picked else "bytes_share"
    found = []
    for mine, theirs in pairs:
        one, two = scores.column(mine), scores.column(theirs)
        low, high = ranks.percentile(boot[:, [one]] - boot[:, [two]], level)
        a, b = (stored.xs(cell, level=("press", "ratio"))[column].sort_index() for cell in (mine, theirs))
        found.append({"ratio": mine[1], "press": press, "reference": theirs[0], "examples": len(scores.values),
                      "score": scores.values[:, one].mean(), "reference_score": scores.values[:, two].mean(),
                      "delta": (scores.values[:, one] - scores.values[:, two]).mean(), "delta_low": low[0],
                      "delta_high": high[0], "bytes_share": scores.bytes_share[one],
                      "reference_bytes_share": scores.bytes_share[two], "same_bytes": bool((a == b).all())})
    return pd.DataFrame(found)


def draw(found: pd.DataFrame, title: str):
    """The correlations (`correlations`) as one heatmap: measures down, press × ratio across, ρ on a diverging scale
    from −1 to 1, each cell annotated with ρ and its interval, framed where the interval excludes 0."""
    plt = style.pyplot()
    from matplotlib.patches import Rectangle

    names = list(dict.fromkeys(found["measure"]))
    cells = list(dict.fromkeys(zip(found["press"], found["ratio"])))
    grid = found.set_index(["measure", "press", "ratio"])
    rho = np.array([[grid.loc[(name, *cell), "rho"] for cell in cells] for name in names], dtype=float)
    labels = [f"{style.press_label(press)}\nr = {ratio:g}" for press, ratio in cells]
    width = max(1.25, style.label_inches(labels) + 0.2)
    figure, ax = plt.subplots(figsize=(width * len(cells) + 3.2, 0.62 * len(names) + 1.9), layout="constrained")
    image = ax.pcolormesh(np.arange(len(cells) + 1) - 0.5, np.arange(len(names) + 1) - 0.5, rho, cmap="RdBu_r",
                          vmin=-1, vmax=1, shading="flat")
    for (row, column), value in np.ndenumerate(rho):
        low, high = grid.loc[(names[row], *cells[column]), ["low", "high"]]
        if not np.isfinite(value):
            ax.text(column, row, "undefined", ha="center", va="center", fontsize=7, color="0.4")
            continue
        spread = np.isfinite(low) and high > low  # no spread: every replicate ranked the heads alike
        strong = spread and (low > 0 or high < 0)
        shown = f"{value:+.2f}\n" + (f"[{low:+.2f}, {high:+.2f}]" if spread else "no spread")
        ax.text(column, row, shown, ha="center", va="center", fontsize=7.5,
                color="white" if abs(value) > 0.6 else "black", fontweight="bold" if strong else "normal")
        if strong:
            ax.add_patch(Rectangle((column - 0.47, row - 0.47), 0.94, 0.94, fill=False, linewidth=1.4,
                                   edgecolor="black"))
    ax.set_xticks(range(len(cells)), labels, fontsize=8)
    ax.set_yticks(range(len(names)), [MEASURES[name][2] if name in MEASURES else name for name in names],
                  fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_gid("correlations")
    bar = figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("Spearman's ρ with the head's needle survival")
    ax.set_title(style.title_lines(title + "\nframed: the 95% interval over the questions excludes 0; 'no spread': "
                                   "every replicate gave the same ρ", 130))
    return figure
