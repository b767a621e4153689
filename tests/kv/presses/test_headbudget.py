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
