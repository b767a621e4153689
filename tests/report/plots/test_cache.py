"""The view of a cache run: every plotted value is the run's table (NLL per press, starting from the full cache at
ratio 0) or the per-head table averaged here with pandas; channel presses stay out of the mass panel."""

from __future__ import annotations

import numpy as np
import pandas as pd
from report_helpers import by_gid, fake_save

from spectra.report.plots.cache import draw_cache, plot_cache
from spectra.runs import CacheRun


def cache_run(tmp_path) -> CacheRun:
    variants = [("full", 0.0), ("knorm", 0.5), ("knorm", 0.25), ("think", 0.5)]
    rng = np.random.default_rng(0)
    table = pd.DataFrame([{"press": press, "ratio": ratio, "nll": 3 + ratio + rng.uniform(), "ppl": 0.0,
                           "key_channel_ratio": ratio if press == "think" else 0.0} for press, ratio in variants])
    heads = pd.DataFrame([{"press": press, "ratio": ratio, "layer": layer, "head": head,
                           "mass_kept": 1.0 if press == "full" else rng.uniform(), "out_err": rng.uniform()}
                          for press, ratio in variants for layer in range(2) for head in range(3)])
    meta = {"kind": "cache", "model": {"name": "tiny"}, "data": {"name": "corpus"}, "context": 70,
            "continuation": 8, "scored": 3}
    return CacheRun(tmp_path, meta, table, heads, pd.DataFrame())


def test_the_view_draws_the_tables(tmp_path) -> None:
    run = cache_run(tmp_path)
    left, right = draw_cache(run).axes
    table = run.table.set_index(["press", "ratio"])["nll"]
    knorm = by_gid(left.lines, "nll:knorm")
    np.testing.assert_array_equal(knorm.get_xdata(), [0.0, 0.25, 0.5])
    np.testing.assert_array_equal(knorm.get_ydata(), [table[("full", 0.0)], table[("knorm", 0.25)],
                                                      table[("knorm", 0.5)]])
    assert by_gid(left.lines, "nll:think").get_label() == "think (key channels)"
    mass = run.head_stats.groupby(["press", "ratio"])["mass_kept"].mean()
    np.testing.assert_allclose(by_gid(right.lines, "mass:knorm").get_ydata(),
                               [1.0, mass[("knorm", 0.25)], mass[("knorm", 0.5)]], rtol=1e-12)
    assert not [line for line in right.lines if line.get_gid() == "mass:think"]


def test_plot_writes_one_figure_into_the_run(tmp_path, monkeypatch) -> None:
    saved = fake_save(monkeypatch)
    plot_cache(cache_run(tmp_path))
    assert [str(name) for name in saved] == [str(tmp_path / "figures" / "cache_nll_vs_ratio")]
