"""What to do with each head: its type from the diagnosis, the method that wins on it in an approx run, a small
rule that predicts the winner from the diagnosis, and DuoAttention's head pattern. Pure numpy and pandas on the
tables of `spectra heads` (diagnosis.csv) and `spectra approx` (heads.csv).

Head types, checked in this order (the first that holds names the head; thresholds are the module constants):

- `induction`: induction_score ≥ INDUCTION (decoders);
- `previous-token`: prev ≥ PREVIOUS;
- `sink`: sink_share ≥ SINK (most queries put more than ε on the first token);
- `local`: local ≥ LOCAL (most of the mass within the window);
- `retrieval`: retrieval ≥ RETRIEVAL (streaming this head alone moves the layer output by that share);
- `mixed`: none of these.

The winner of a head at a budget is the method with the smallest mean `out_err` there. The rule is a decision tree
of depth ≤ 2 grown greedily on the diagnosis columns (each split the feature and threshold — a midpoint between
consecutive distinct values — that leave the fewest heads misclassified by their leaf's majority winner), and its
held-out accuracy is that of trees grown on the other folds of a seeded FOLDS-fold split of the heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: head-type thresholds (see the module docstring)
INDUCTION, PREVIOUS, SINK, LOCAL, RETRIEVAL = 0.4, 0.5, 0.5, 0.8, 0.1
HEAD_TYPES = ("induction", "previous-token", "sink", "local", "retrieval", "mixed")
#: the diagnosis columns a rule may split on
FEATURES = ("sink_share", "sink_mean", "prev", "local", "entropy", "top10", "keynorm_corr", "retrieval",
            "induction_score", "rank90", "c_at", "qk_rank90", "ov_rank90")
FOLDS = 5


def head_types(diagnosis: pd.DataFrame) -> pd.Series:
    """Each row's head type (see the module docstring)."""
    def column(name: str) -> np.ndarray:
        return diagnosis[name].to_numpy(float) if name in diagnosis else np.full(len(diagnosis), np.nan)

    tests = [column("induction_score") >= INDUCTION, column("prev") >= PREVIOUS, column("sink_share") >= SINK,
             column("local") >= LOCAL, column("retrieval") >= RETRIEVAL]
    types = np.full(len(diagnosis), HEAD_TYPES[-1], dtype=object)
    for name, holds in zip(reversed(HEAD_TYPES[:-1]), reversed(tests)):
        types = np.where(holds, name, types)
    return pd.Series(types, index=diagnosis.index, name="head_type")


def winners(approx_heads: pd.DataFrame, metric: str = "out_err") -> pd.DataFrame:
    """One row per (budget, layer, head): the method with the smallest mean `metric`, its error, the runner-up's
    and the ratio runner-up / winner (how clear the win is)."""
    table = approx_heads[approx_heads["metric"] == metric].dropna(subset=["mean"])
    rows = []
    for (budget, layer, head), cell in table.groupby(["budget", "layer", "head"], sort=True):
        ordered = cell.sort_values(["mean", "method"])
        best, errors = ordered.iloc[0], ordered["mean"].to_numpy(float)
        second = errors[1] if len(errors) > 1 else np.nan
        rows.append({"budget": int(budget), "layer": int(layer), "head": int(head), "winner": best["method"],
                     "winner_err": float(best["mean"]),
                     "runner_up": ordered.iloc[1]["method"] if len(errors) > 1 else "",
                     "runner_up_err": second, "margin": second / max(float(best["mean"]), 1e-300)})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Node:
    """A split (feature < threshold goes left) or, with feature None, a leaf predicting `label`."""

    label: str
    feature: str | None = None
    threshold: float = np.nan
    left: Node | None = None
    right: Node | None = None

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        if self.feature is None:
            return np.full(len(frame), self.label, dtype=object)
        goes_left = frame[self.feature].to_numpy(float) < self.threshold
        out = np.empty(len(frame), dtype=object)
        out[goes_left] = self.left.predict(frame[goes_left])
        out[~goes_left] = self.right.predict(frame[~goes_left])
        return out

    def describe(self, depth: int = 0) -> list[str]:
        """The rule as indented lines."""
        pad = "  " * depth
        if self.feature is None:
            return [f"{pad}→ {self.label}"]
        return ([f"{pad}{self.feature} < {self.threshold:.4g}:", *self.left.describe(depth + 1),
                 f"{pad}{self.feature} ≥ {self.threshold:.4g}:", *self.right.describe(depth + 1)])


def majority(labels: np.ndarray) -> str:
    """The most frequent label (ties: the first in sorted order)."""
    values, counts = np.unique(labels.astype(str), return_counts=True)
    return str(values[np.argmax(counts)])


def _errors(labels: np.ndarray) -> int:
    return int(len(labels) - np.unique(labels.astype(str), return_counts=True)[1].max()) if len(labels) else 0


def grow(frame: pd.DataFrame, labels: np.ndarray, features: list[str], depth: int = 2) -> Node:
    """A decision tree of depth ≤ `depth` (see the module docstring); no split that does not lower the errors."""
    leaf = Node(majority(labels))
    if depth == 0 or _errors(labels) == 0:
        return leaf
    best = (_errors(labels), None, np.nan)
    for feature in features:
        values = frame[feature].to_numpy(float)
        distinct = np.unique(values[np.isfinite(values)])
        for threshold in (distinct[1:] + distinct[:-1]) / 2:
            left = values < threshold
            errors = _errors(labels[left]) + _errors(labels[~left])
            if errors < best[0]:
                best = (errors, feature, float(threshold))
    if best[1] is None:
        return leaf
    left = frame[best[1]].to_numpy(float) < best[2]
    return Node(leaf.label, best[1], best[2], grow(frame[left], labels[left], features, depth - 1),
                grow(frame[~left], labels[~left], features, depth - 1))


def usable_features(frame: pd.DataFrame) -> list[str]:
    """The FEATURES present with a finite value for every head."""
    return [name for name in FEATURES if name in frame and np.isfinite(frame[name].to_numpy(float)).all()]


def held_out_accuracy(frame: pd.DataFrame, labels: np.ndarray, features: list[str], seed: int = 0) -> float:
    """Accuracy on each fold of trees grown on the other folds (FOLDS folds of a seeded permutation)."""
    order = np.random.default_rng(seed).permutation(len(frame))
    folds = np.array_split(order, min(FOLDS, len(frame)))
    right = 0
    for fold in folds:
        train = np.setdiff1d(order, fold)
        tree = grow(frame.iloc[train], labels[train], features)
        right += int((tree.predict(frame.iloc[fold]) == labels[fold]).sum())
    return right / len(frame)


def method_map(diagnosis: pd.DataFrame, approx_heads: pd.DataFrame, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """method_map.csv (the winners joined with the diagnosis and each head's type and predicted winner) and
    rules.csv (one row per budget: the rule's lines, its accuracy on the heads it was grown on, held out, and the
    majority baseline)."""
    won = winners(approx_heads)
    if won.empty:
        return won, pd.DataFrame()
    joined = won.merge(diagnosis.assign(head_type=head_types(diagnosis)), on=["layer", "head"], how="inner")
    features = usable_features(joined)
    parts, rules = [], []
    for budget, frame in joined.groupby("budget", sort=True):
        frame = frame.reset_index(drop=True)
        labels = frame["winner"].to_numpy(object)
        tree = grow(frame, labels, features)
        predicted = tree.predict(frame)
        parts.append(frame.assign(predicted=predicted))
        rules.append({"budget": int(budget), "heads": len(frame), "rule": " | ".join(tree.describe()),
                      "accuracy": float((predicted == labels).mean()),
                      "held_out_accuracy": held_out_accuracy(frame, labels, features, seed),
                      "baseline": float((labels == majority(labels)).mean()), "baseline_winner": majority(labels)})
    return pd.concat(parts, ignore_index=True), pd.DataFrame(rules)


def duo_pattern(diagnosis: pd.DataFrame, layers: int, heads: int, kv_heads: int, share: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """DuoAttention's `full_attention_heads.tsv` (layers × kv_heads of 1 = full attention, 0 = streaming) keeping the
    `share` of key/value heads with the highest retrieval score, and the per-KV-head scores behind it. A KV head's
    score is the largest of its query heads' (streaming it streams all of them, so it must stay full if any one
    needs the whole context); ties go to the earlier (layer, KV head)."""
    group = np.arange(heads) // (heads // kv_heads)
    scores = np.full((layers, heads), np.nan)
    scores[diagnosis["layer"].to_numpy(int), diagnosis["head"].to_numpy(int)] = diagnosis["retrieval"].to_numpy(float)
    per_kv = np.stack([np.nanmax(scores[:, group == g], axis=1) for g in range(kv_heads)], axis=1)
    keep = int(round(share * per_kv.size))
    order = np.argsort(-np.nan_to_num(per_kv.ravel(), nan=-np.inf), kind="stable")
    full = np.zeros(per_kv.size)
    full[order[:keep]] = 1.0
    full = full.reshape(per_kv.shape)
    layer, kv = np.meshgrid(np.arange(layers), np.arange(kv_heads), indexing="ij")
    table = pd.DataFrame({"layer": layer.ravel(), "kv_head": kv.ravel(), "retrieval": per_kv.ravel(),
                          "full_attention": full.ravel().astype(int)})
    return pd.DataFrame(full), table
