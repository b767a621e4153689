"""The bridge from a head's spectrum to the needle a press kept there, on hand-made runs: the measures per key/value
head against pandas, Spearman's ρ and its interval against scipy.stats.spearmanr on replicates drawn here, the
budget comparison's paired difference and its bytes check, and the refusals in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from spectra.errors import SpectraError
from spectra.kv.tasks.summary import poisson_weights
from spectra.report.bridge import budget_comparison, correlations, join, spectrum_measures, table
from spectra.report.evaluate import TaskRun

LAYERS, HEADS, KV_HEADS, EXAMPLES = 3, 4, 2, 12
TASKS = np.array(["a"] * 6 + ["b"] * 6)
MODEL = {"name": "tiny", "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS}
CELLS = [("snapkv", 0.5), ("headbudget(x@rank)", 0.5)]


def analysis(folder: Path, model: dict = MODEL, kind: str = "analyze", seed: int = 0) -> SimpleNamespace:
    """An analyze run's metrics.csv (per layer and query head) and qkv.csv (keys per key/value head, both stages)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"layer": layer, "head": head, "c_at_mean": rng.uniform(0.3, 1), "rank90_mean": rng.uniform(2, 60),
                   "entropy_mean": rng.uniform(0.5, 4), "sink_mean": rng.uniform(0, 0.9)}
                  for layer in range(LAYERS) for head in range(HEADS)]).to_csv(folder / "metrics.csv", index=False)
    pd.DataFrame([{"tensor": tensor, "stage": stage, "layer": layer, "head": head, "rank90_mean": rng.uniform(1, 16)}
                  for tensor, heads in (("q", HEADS), ("k", KV_HEADS)) for stage in ("projection", "attention")
                  for layer in range(LAYERS) for head in range(heads)]).to_csv(folder / "qkv.csv", index=False)
    return SimpleNamespace(path=folder, meta={"kind": kind, "model": model, "rope": True})


def task_run(folder: Path, seed: int = 1, model: dict = MODEL, answered=None, loose=(1, 1)) -> TaskRun:
    """A task run of EXAMPLES records over CELLS: the full cache answers `answered` (default all but examples 3 and
    9), example 11 hides no needle, and the press of CELLS[1] leaves head `loose` (layer, head) uncompressed."""
    rng = np.random.default_rng(seed)
    answered = [i not in (3, 9) for i in range(EXAMPLES)] if answered is None else answered
    survival = rng.uniform(0, 1, (len(CELLS) + 1, EXAMPLES, LAYERS, KV_HEADS))
    survival[0] = 1.0
    survival[:, 11] = np.nan
    rows = [{"press": "full", "ratio": 0.0, "example": i, "question": 0, "task": TASKS[i], "prediction": "x",
             "score": float(answered[i]), "bytes": 1000.0, "bytes_share": 1.0} for i in range(EXAMPLES)]
    rows += [{"press": press, "ratio": ratio, "example": i, "question": 0, "task": TASKS[i], "prediction": "y",
              "score": float(rng.uniform() < 0.5), "bytes": 500.0, "bytes_share": 0.5}
             for press, ratio in CELLS for i in range(EXAMPLES)]
    needle = [{"press": press, "ratio": ratio, "layer": layer, "head": head,
               "kept": 1.0 if press == "full" or (index == 2 and (layer, head) == loose) else 0.5}
              for index, (press, ratio) in enumerate([("full", 0.0), *CELLS])
              for layer in range(LAYERS) for head in range(KV_HEADS)]
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "needle.npz", survival=survival, press=np.array(["full", *[p for p, _ in CELLS]]),
             ratio=np.array([0.0, *[r for _, r in CELLS]]), example=np.arange(EXAMPLES),
             question=np.zeros(EXAMPLES, int))
    meta = {"kind": "evaluate", "model": model, "settings": {"seed": 0}, "data": {"sha256": "f", "name": "t"}}
    return TaskRun(folder, meta, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(needle),
                   pd.DataFrame())


def test_the_measures_are_the_group_means_and_the_keys_per_kv_head(tmp_path) -> None:
    run = analysis(tmp_path / "a")
    found = spectrum_measures(run).set_index(["layer", "head"])
    metrics = pd.read_csv(tmp_path / "a" / "metrics.csv")
    metrics["kv"] = metrics["head"] // (HEADS // KV_HEADS)
    expected = metrics.groupby(["layer", "kv"])["entropy_mean"].mean()
    np.testing.assert_allclose(found["entropy"].to_numpy(), expected.to_numpy(), rtol=1e-12)
    keys = pd.read_csv(tmp_path / "a" / "qkv.csv").query("tensor == 'k' and stage == 'projection'")
    np.testing.assert_allclose(found["key_rank90_before_rope"].to_numpy(), keys["rank90_mean"].to_numpy())


def test_survival_over_the_answered_needles_and_spearman_against_scipy(tmp_path) -> None:
    run = task_run(tmp_path / "t")
    bridge = join(analysis(tmp_path / "a"), [run])
    chosen = [i for i in range(EXAMPLES) if i not in (3, 9, 11)]  # answered, with a needle
    assert list(bridge.records) == chosen
    survival = run.arrays()["survival"]
    rows = table(bridge).set_index(["press", "ratio", "layer", "head"]).sort_index()
    np.testing.assert_allclose(rows.loc[CELLS[0], "survival"].to_numpy(),
                               survival[1, chosen].mean(axis=0).ravel(), rtol=1e-12)
    assert not rows.loc[(*CELLS[1], 1, 1), "compressed"] and rows.loc[CELLS[0], "compressed"].all()
    found = correlations(bridge, count=400).set_index(["press", "ratio", "measure"])
    mask = np.ones(LAYERS * KV_HEADS, bool)
    mask[1 * KV_HEADS + 1] = False  # the head the second press left whole
    measure = bridge.measure("rank90").ravel()[mask]
    per_example = survival[2, chosen].reshape(len(chosen), -1)[:, mask]
    got = found.loc[(*CELLS[1], "rank90")]
    assert got["heads"] == 5
    assert got["rho"] == pytest.approx(spearmanr(measure, per_example.mean(axis=0)).statistic, abs=1e-12)
    # the interval, drawn here: per replicate each task's Poisson-weighted mean per head, the tasks by their shares
    weights = poisson_weights(chosen, 0, 400)
    tasks = TASKS[chosen]
    parts, used = 0.0, np.ones(400, bool)
    for task in ("a", "b"):
        inside = tasks == task
        mass = weights[:, inside].sum(axis=1)
        used &= mass > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            parts = parts + inside.mean() * (weights[:, inside] @ per_example[inside]) / mass[:, None]
    rhos = np.array([spearmanr(measure, row).statistic for row in parts[used]])
    assert got["replicates"] == np.isfinite(rhos).sum()
    assert got["low"] == pytest.approx(np.quantile(rhos, 0.025), abs=1e-9)
    assert got["high"] == pytest.approx(np.quantile(rhos, 0.975), abs=1e-9)


def test_runs_of_another_model_or_shape_are_refused(tmp_path) -> None:
    run = task_run(tmp_path / "t")
    for model, what in (({**MODEL, "name": "other"}, "name"), ({**MODEL, "kv_heads": 4}, "kv_heads")):
        with pytest.raises(SpectraError, match=f"ran different models \\({what}"):
            join(analysis(tmp_path / "b", model), [run])
    with pytest.raises(SpectraError, match="is a cache run"):
        join(analysis(tmp_path / "c", kind="cache"), [run])
    with pytest.raises(SpectraError, match="answers no question"):
        join(analysis(tmp_path / "a"), [task_run(tmp_path / "none", answered=[False] * EXAMPLES)])
    with pytest.raises(SpectraError, match="nothing to bridge"):  # it answers only the record without a needle
        join(analysis(tmp_path / "a"), [task_run(tmp_path / "bare", answered=[i == 11 for i in range(EXAMPLES)])])
    (tmp_path / "t" / "needle.npz").unlink()
    with pytest.raises(SpectraError, match="no needle.npz"):
        join(analysis(tmp_path / "a"), [run])
    metrics = pd.read_csv(tmp_path / "a" / "metrics.csv")
    metrics[metrics["head"] < 2].to_csv(tmp_path / "a" / "metrics.csv", index=False)
    with pytest.raises(SpectraError, match="some layers or heads only"):
        spectrum_measures(SimpleNamespace(path=tmp_path / "a", meta={"kind": "analyze", "model": MODEL}))


def test_the_budget_against_each_reference_paired_and_bytes_checked(tmp_path) -> None:
    rows = task_run(tmp_path / "t").examples
    extra = rows[rows["press"] == "snapkv"].assign(press="adakv(snapkv)")
    extra.loc[extra["example"] == 4, "bytes"] = 501.0  # one example stored a row more
    rows = pd.concat([rows, extra], ignore_index=True)
    found = budget_comparison(rows, "headbudget(x@rank)", seed=0).set_index("reference")
    assert not found.loc["adakv(snapkv)", "same_bytes"] and found.loc["snapkv", "same_bytes"]
    mine = rows[rows["press"] == "headbudget(x@rank)"].set_index("example")["score"]
    theirs = rows[rows["press"] == "snapkv"].set_index("example")["score"]
    got = found.loc["snapkv"]
    assert got["delta"] == pytest.approx((mine - theirs).mean()) and got["examples"] == EXAMPLES
    weights = poisson_weights(range(EXAMPLES), 0)
    diff = (mine - theirs).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        halves = [(weights[:, TASKS == t] @ diff[TASKS == t]) / weights[:, TASKS == t].sum(axis=1) for t in "ab"]
    used = np.all([weights[:, TASKS == t].sum(axis=1) > 0 for t in "ab"], axis=0)
    direct = (0.5 * halves[0] + 0.5 * halves[1])[used]
    assert got["delta_low"] == pytest.approx(np.quantile(direct, 0.025), abs=1e-9)
    assert got["delta_high"] == pytest.approx(np.quantile(direct, 0.975), abs=1e-9)
    with pytest.raises(SpectraError, match="not among the runs' presses"):
        budget_comparison(rows, "headbudget(y)")
    with pytest.raises(SpectraError, match="none of knorm ran"):
        budget_comparison(rows, "headbudget(x@rank)", ["knorm"])
