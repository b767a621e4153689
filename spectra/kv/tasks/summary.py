"""Per-task means of a task run's per-example scores, beside the full cache's, with bootstrap intervals over examples.

A press's score on a task is the mean of its examples' scores; the full cache's mean on the same examples stands
beside it, with the paired difference (press − full, example by example). Both intervals are percentile intervals of
a Poisson bootstrap over examples: replicate r weights example i by the r-th of `replicates` Poisson(1) draws seeded
by (run seed, Domain.BOOTSTRAP, i) — the scheme `spectra analyze` uses for its sequences — so an example's weights
depend on its index in the task file only, never on which other examples, presses or lengths share the table, and
every press is resampled with the same weights (the difference is paired). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...seeds import Domain, derive_seed

#: bootstrap replicates and the intervals' level
REPLICATES, LEVEL = 2000, 0.95
#: the per-task table's columns after its keys
COLUMNS = ("examples", "score", "low", "high", "full", "delta", "delta_low", "delta_high", "bytes_share")


def poisson_weights(examples: Sequence[int], seed: int, replicates: int = REPLICATES) -> np.ndarray:
    """(replicates, len(examples)) Poisson(1) bootstrap weights, column i fixed by (seed, examples[i])."""
    return np.stack([np.random.default_rng(derive_seed(seed, Domain.BOOTSTRAP, int(example))).poisson(1.0, replicates)
                     for example in examples], axis=1).astype(np.float64)


def interval(values: np.ndarray, weights: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of the weighted means Σ wᵢ xᵢ / Σ wᵢ over the replicates (rows of `weights`) that weigh
    some example; NaN when none does or there are no values."""
    total = weights.sum(axis=1)
    used = total > 0
    if not used.any() or values.size == 0:
        return float("nan"), float("nan")
    means = weights[used] @ values / total[used]
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def task_scores(examples: pd.DataFrame, seed: int, by: Sequence[str] = ("task",), replicates: int = REPLICATES,
                level: float = LEVEL) -> pd.DataFrame:
    """One row per (press, ratio, *by) of the per-example table `examples` (press, ratio, example, score and the
    `by` columns; the full cache as press 'full', ratio 0): `COLUMNS` (`bytes_share`: the mean share of the context
    cache's bytes the cells kept, NaN when the examples do not say). With a `question` column (several rows per
    example: a many-question record's questions), each row is paired with the full cache's on the same question, and
    an example's questions share its bootstrap weight (the records are what is resampled)."""
    unit = ["example", "question"] if "question" in examples.columns else ["example"]
    full = examples[examples["press"] == "full"].set_index(unit)["score"]
    weights = poisson_weights(sorted(examples["example"].unique()), seed, replicates)
    column = {example: i for i, example in enumerate(sorted(examples["example"].unique()))}
    rows = []
    for key, group in examples.groupby(["press", "ratio", *by], sort=False):
        group = group.sort_values(unit)
        chosen = weights[:, [column[example] for example in group["example"]]]
        scores = group["score"].to_numpy(dtype=np.float64)
        where = pd.MultiIndex.from_frame(group[unit]) if len(unit) > 1 else group["example"]
        baseline = full.reindex(where).to_numpy(dtype=np.float64)
        delta = scores - baseline
        rows.append({**dict(zip(["press", "ratio", *by], key)), "examples": len(group), "score": scores.mean(),
                     **dict(zip(("low", "high"), interval(scores, chosen, level))), "full": baseline.mean(),
                     "delta": delta.mean(), **dict(zip(("delta_low", "delta_high"), interval(delta, chosen, level))),
                     "bytes_share": group["bytes_share"].mean() if "bytes_share" in group else np.nan})
    return pd.DataFrame(rows, columns=["press", "ratio", *by, *COLUMNS])


#: the question-drop table's columns after its keys
DROP_COLUMNS = ("questions", "in_view", "once", "drop", "drop_low", "drop_high")


def question_drop(in_view: pd.DataFrame, once: pd.DataFrame, seed: int, replicates: int = REPLICATES,
                  level: float = LEVEL) -> pd.DataFrame:
    """What compressing once for many questions costs, the drop KVzip reports: per (press, ratio, task), over the
    (example, question) pairs both per-example tables hold, the mean score with the question in view (`in_view`: a
    query-aware run, one compression per question), the mean score from one query-agnostic compression answering
    every question of the record (`once`), and `drop` = in_view − once with its paired bootstrap interval (Poisson
    weights per record, seeded as `task_scores`' are, a record's questions sharing its weight)."""
    keys = ["press", "ratio", "example", "question"]
    merged = in_view[[*keys, "task", "score"]].merge(once[[*keys, "score"]], on=keys, suffixes=("_in_view", "_once"))
    examples = sorted(merged["example"].unique())
    weights = poisson_weights(examples, seed, replicates)
    column = {example: i for i, example in enumerate(examples)}
    rows = []
    for (press, ratio, task), group in merged.groupby(["press", "ratio", "task"], sort=False):
        drop = (group["score_in_view"] - group["score_once"]).to_numpy(dtype=np.float64)
        chosen = weights[:, [column[example] for example in group["example"]]]
        low, high = interval(drop, chosen, level)
        rows.append({"press": press, "ratio": ratio, "task": task, "questions": len(group),
                     "in_view": group["score_in_view"].mean(), "once": group["score_once"].mean(),
                     "drop": drop.mean(), "drop_low": low, "drop_high": high})
    return pd.DataFrame(rows, columns=["press", "ratio", "task", *DROP_COLUMNS])
