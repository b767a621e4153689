"""The spectrum-guided per-head budget against numpy: counts ∝ the weights (water-filled, whole tokens) adding up to
the uniform press's, and each head keeping its count of SnapKV's best tokens."""

from __future__ import annotations

import numpy as np
import pytest

from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.headbudget import head_budgets

from ...anatomy.test_headweights import fake_run
from .conftest import make_prefill


@pytest.mark.parametrize("ratio", [0.5, 0.8])
def test_budgets_follow_the_weights_at_the_uniform_total(ratio) -> None:
    weights = np.array([[1.0, 2.0], [3.0, 4.0]])
    counts = head_budgets(weights, 1000, ratio)
    assert counts.sum() == 4 * n_kept(1000, ratio) and counts.min() >= 1
    exact = weights / weights.sum() * 4 * n_kept(1000, ratio)  # no head reaches the whole context here
    assert np.abs(counts - exact).max() < 1


def test_a_head_wanting_more_than_the_context_is_capped_and_the_rest_shared() -> None:
    counts = head_budgets(np.array([[100.0, 1.0], [1.0, 1.0]]), 100, 0.5)
    assert counts[0, 0] == 100 and counts.sum() == 200
    assert np.abs(counts.ravel()[1:] - 100 / 3).max() < 1


def test_each_head_keeps_its_count_of_snapkvs_best(tmp_path) -> None:
    folder, _ = fake_run(tmp_path / "run", layers=1)
    press = REGISTRY[f"headbudget({folder})"]
    prefill, _ = make_prefill(length=200)
    part = press.compress(prefill, 0.5)
    counts = press.budgets(200, 0.5)[0]
    np.testing.assert_array_equal(part.counts().numpy(), counts)
    scores = REGISTRY["snapkv"].score(prefill, 0.5).numpy()
    mask = part.kept_mask(200).numpy()
    for head in range(2):
        chosen = np.sort(np.argsort(-scores[head], kind="stable")[:counts[head]])
        np.testing.assert_array_equal(np.flatnonzero(mask[head]), chosen)
    assert part.saved == pytest.approx(1 - counts.sum() / 400)
    assert press.windowed and REGISTRY.facts(f"headbudget({folder})")["windowed"]


def test_local_layers_take_no_budget_and_the_global_ones_share_the_uniform_total() -> None:
    """A sliding-window layer keeps its window whatever the press: the global layers share what the uniform press
    keeps in them, in proportion to their weights."""
    weights = np.array([[9.0, 9.0], [1.0, 2.0], [9.0, 9.0], [3.0, 4.0]])
    counts = head_budgets(weights, 1000, 0.5, local=[True, False, True, False])
    assert (counts[[0, 2]] == 0).all() and counts.sum() == 4 * n_kept(1000, 0.5)
    exact = np.array([[1.0, 2.0], [3.0, 4.0]]) / 10 * 4 * n_kept(1000, 0.5)
    assert np.abs(counts[[1, 3]] - exact).max() < 1


def test_the_run_hands_the_press_its_layers_windows(tmp_path) -> None:
    folder, _ = fake_run(tmp_path / "run", layers=2)
    press = REGISTRY[f"headbudget({folder})"]
    assert press.for_run(windows=[None, None], layers=2) is press
    bound = press.for_run(windows=[8, None], layers=2)
    assert bound.local == (True, False) and bound.name == press.name
    assert bound.budgets(200, 0.5)[0].sum() == 0 and bound.budgets(200, 0.5)[1].sum() == 2 * n_kept(200, 0.5)


def test_on_a_sliding_window_model_it_stores_the_uniform_press_bytes(tmp_path) -> None:
    """Tiny Gemma 3 (two local layers of window 8, one global): headbudget's cache holds what SnapKV's does at the
    same ratio on every example (before the windows reached the press, the global layer took the local layers'
    budget too and stored more)."""
    import spectra

    import task_files
    import tiny

    folder, _ = fake_run(tmp_path / "run", layers=3, heads=4, kv_heads=1, seed=3)
    model = tiny.save_gemma3(tmp_path / "gemma")
    path = task_files.write(tmp_path / "tasks.jsonl", task_files.records(count=2, words=40))
    run = spectra.evaluate(str(model), str(path), presses=f"snapkv,headbudget({folder})", ratios="0.5",
                           out=tmp_path / "eval", progress=None, notify=lambda line: None)
    stored = run.examples.set_index(["press", "example"])["bytes"]
    np.testing.assert_array_equal(stored.loc[f"headbudget({folder})"].to_numpy(), stored.loc["snapkv"].to_numpy())
    assert (stored.loc["snapkv"] < stored.loc["full"]).all()
