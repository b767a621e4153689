"""The views of a task run: every plotted value is one of its tables' (score per press and ratio from the full cache
at ratio 0, its interval), a mean of the per-example table computed here with pandas (score per depth and length), or
the per-head needle table laid out per layer and head."""

from __future__ import annotations

import numpy as np
import pandas as pd
from report_helpers import by_gid, fake_save

from spectra.report.evaluate import draw_needle, draw_scores, draw_survival, plot
from spectra.report.evaluate import TaskRun
from spectra.kv.tasks.summary import task_scores

CELLS = [("full", 0.0), ("knorm", 0.5), ("knorm", 0.75), ("snapkv", 0.5), ("snapkv", 0.75)]


def task_run(tmp_path) -> TaskRun:
    rng = np.random.default_rng(0)
    rows = []
    for example in range(12):
        task = "passkey" if example < 8 else "vt"
        length, depth = (1024, 2048)[example % 2], (0.0, 0.5, 1.0, np.nan)[example // 3 % 4]
        for press, ratio in CELLS:
            rows.append({"press": press, "ratio": ratio, "example": example, "task": task, "length": length,
                         "depth": depth, "prediction": "x", "score": float(press == "full" or rng.uniform() < 0.5)})
    examples = pd.DataFrame(rows)
    needle = pd.DataFrame([{"press": press, "ratio": ratio, "layer": layer, "head": head,
                            "needle_kept": 1.0 if press == "full" else rng.uniform(), "needle_kept_failed": 0.0,
                            "failed": 0, "needle_mass": rng.uniform()}
                           for press, ratio in CELLS for layer in range(4) for head in range(3)])
    meta = {"kind": "evaluate", "model": {"name": "tiny"}, "data": {"name": "tasks.jsonl"}}
    return TaskRun(tmp_path, meta, examples, task_scores(examples, 0, replicates=50),
                   task_scores(examples, 0, ("task", "length"), replicates=50), needle, pd.DataFrame())


def test_scores_against_the_ratio(tmp_path) -> None:
    run = task_run(tmp_path)
    figure = draw_scores(run)
    scores = run.scores.set_index(["task", "press", "ratio"])
    for ax, task in zip(figure.axes, ("passkey", "vt")):
        line = by_gid(ax.lines, f"score:{task}:snapkv")
        np.testing.assert_array_equal(line.get_xdata(), [0.0, 0.5, 0.75])
        np.testing.assert_allclose(line.get_ydata(), [scores.loc[(task, "full", 0.0), "score"],
                                                      scores.loc[(task, "snapkv", 0.5), "score"],
                                                      scores.loc[(task, "snapkv", 0.75), "score"]])
        assert by_gid(ax.lines, f"full:{task}").get_ydata()[0] == scores.loc[(task, "full", 0.0), "score"]


def test_the_needle_heatmap_is_the_mean_per_depth_and_length(tmp_path) -> None:
    run = task_run(tmp_path)
    figure = draw_needle(run)
    placed = run.examples.dropna(subset=["depth"])
    for press, ratio in CELLS:
        mesh = next(c for ax in figure.axes for c in ax.collections if c.get_gid() == f"needle:{press}:{ratio}")
        chosen = placed[(placed["press"] == press) & (placed["ratio"] == ratio)]
        want = chosen.pivot_table(index="depth", columns="length", values="score", aggfunc="mean")
        np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(want.shape), want.to_numpy())


def test_survival_per_layer_and_head(tmp_path) -> None:
    run = task_run(tmp_path)
    figure = draw_survival(run, 0.75)
    grids = {ax.get_gid(): ax.collections[0] for ax in figure.axes if ax.get_gid()}
    assert set(grids) == {"mass", "kept:knorm", "kept:snapkv"}
    needle = run.needle
    mass = needle[needle["press"] == "full"].sort_values(["layer", "head"])["needle_mass"].to_numpy()
    np.testing.assert_allclose(np.asarray(grids["mass"].get_array()).ravel(), mass)
    knorm = needle[(needle["press"] == "knorm") & (needle["ratio"] == 0.75)].sort_values(["layer", "head"])
    np.testing.assert_allclose(np.asarray(grids["kept:knorm"].get_array()).ravel(), knorm["needle_kept"].to_numpy())
    assert grids["kept:knorm"].get_clim() == (0.0, 1.0), "every press on one scale"
    titles = {ax.get_gid(): ax.get_title() for ax in figure.axes if ax.get_gid()}
    assert titles["kept:knorm"] == "knorm:\nkept"


def test_plot_writes_every_view(tmp_path, monkeypatch) -> None:
    names = fake_save(monkeypatch)
    plot(task_run(tmp_path), tmp_path / "figures")
    assert [name.rsplit("/", 1)[-1] for name in names] == ["task_scores", "needle_heatmap", "needle_survival_r0.5",
                                                          "needle_survival_r0.75"]


def test_presses_with_the_same_scores_stay_visible_and_a_ratio_free_press_is_one_point(tmp_path) -> None:
    """Issue 41, item 11: adakv(snapkv) hid exactly behind snapkv-like lines and kivi4 behind decoding(knorm) (five
    legend entries, two visible lines). Now presses whose points are all the same are drawn side by side, `DODGE`
    apart (the full cache's start shared), and the figure's key names them; every cell sits at the share of the
    bytes it stores (item 10), kivi4, the same at every ratio, at one point."""
    from spectra.report.plots.scores import DODGE

    rows = []
    for example in range(6):
        for press, ratio in [("full", 0.0), *[(p, r) for p in ("snapkv", "adakv(snapkv)", "kivi4") for r in (0.5, 0.75)]]:
            score = 1.0 if press in ("full", "kivi4") else float(example % 3 == 0) if ratio == 0.5 else 0.0
            rows.append({"press": press, "ratio": ratio, "example": example, "task": "passkey", "length": 1024,
                         "depth": 0.5, "prediction": "x", "score": score,
                         "bytes_share": 1.0 if press == "full" else 0.45 if press == "kivi4" else 1 - ratio})
    examples = pd.DataFrame(rows)
    run = TaskRun(tmp_path, {"model": {"name": "tiny"}, "data": {"name": "t.jsonl"}}, examples,
                  task_scores(examples, 0, replicates=50), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    figure = draw_scores(run)
    (ax,) = figure.axes
    (key,) = figure.legends
    snapkv, adakv = by_gid(ax.lines, "score:passkey:snapkv"), by_gid(ax.lines, "score:passkey:adakv(snapkv)")
    np.testing.assert_allclose(snapkv.get_xdata(), [1.0, 0.5 - DODGE / 2, 0.25 - DODGE / 2])
    np.testing.assert_allclose(adakv.get_xdata(), [1.0, 0.5 + DODGE / 2, 0.25 + DODGE / 2])
    np.testing.assert_array_equal(snapkv.get_ydata(), adakv.get_ydata())
    assert key.get_title().get_text() == "side by side, the same scores:\npasskey: snapkv = adakv(snapkv)"
    kivi = by_gid(ax.lines, "score:passkey:kivi4")
    assert list(kivi.get_xdata()) == [0.45] and list(kivi.get_ydata()) == [1.0]
    assert kivi.get_linestyle() == "None"
    assert "kivi4 (any ratio)" in [text.get_text() for text in key.get_texts()]
    assert ax.get_xlabel() == "Share of the full cache's bytes stored" and ax.xaxis_inverted()


def test_the_needle_heatmap_s_one_colour_bar_spans_every_panel(tmp_path) -> None:
    """Issue 41, item 15: the heatmap's one colour bar (one scale for every panel) was a short bar beside the middle
    row, read as that row's own. It now runs the height of the grid, right of every panel."""
    figure = draw_needle(task_run(tmp_path))
    figure.canvas.draw()
    (bar,) = [ax for ax in figure.axes if ax.get_ylabel() == "Mean score"]
    panels = [ax for ax in figure.axes if ax.get_visible() and ax is not bar]
    top, bottom = max(ax.get_position().y1 for ax in panels), min(ax.get_position().y0 for ax in panels)
    box = bar.get_position()
    assert box.height >= 0.9 * (top - bottom), (box.height, top - bottom)
    assert box.y0 >= bottom - 0.01 and box.y1 <= top + 0.01
    assert box.x0 >= max(ax.get_position().x1 for ax in panels)


def test_a_press_the_same_at_every_ratio_is_one_needle_panel(tmp_path) -> None:
    """kivi ignores the ratio: its needle heatmap was drawn once per ratio, the same panel twice; it is one panel,
    titled 'any ratio', beside the panels of the presses the ratio changes."""
    run = task_run(tmp_path)
    frozen = run.examples[run.examples["press"] == "full"].assign(press="kivi4", bytes_share=0.28, bytes=28.0)
    examples = pd.concat([run.examples.assign(bytes_share=run.examples["ratio"].rsub(1.0),
                                              bytes=run.examples["ratio"].rsub(1.0) * 100),
                          frozen.assign(ratio=0.5), frozen.assign(ratio=0.75)], ignore_index=True)
    run = TaskRun(tmp_path, run.meta, examples, task_scores(examples, 0, replicates=50),
                  task_scores(examples, 0, ("task", "length"), replicates=50), run.needle, pd.DataFrame())
    figure = draw_needle(run)
    shown = {c.get_gid(): ax.get_title() for ax in figure.axes if ax.get_visible() for c in ax.collections
             if (c.get_gid() or "").startswith("needle:")}
    assert shown["needle:kivi4:0.5"] == "kivi4, any ratio" and "needle:kivi4:0.75" not in shown
    assert shown["needle:knorm:0.75"] == "knorm, ratio 0.75"


def test_the_survival_picture_s_two_quantities_have_two_colour_maps_and_named_bars(tmp_path) -> None:
    """Issue 55, item 7: the full cache's attention mass (0 to ~0.03) and the share of the needle kept (0 to 1) were
    drawn in one colour map, so a cell's colour read the same in both; each has its own map now, and its bar names
    its quantity, its range and (the kept share's) the ratio."""
    from spectra.report.plots import style

    run = task_run(tmp_path)
    figure = draw_survival(run, 0.5)
    meshes = {ax.get_gid(): ax.collections[0] for ax in figure.axes if ax.get_gid()}
    assert meshes["mass"].get_cmap().name == style.ATTENTION_CMAP != style.HEATMAP_CMAP
    assert {meshes[gid].get_cmap().name for gid in ("kept:knorm", "kept:snapkv")} == {style.HEATMAP_CMAP}
    bars = [ax.get_ylabel() for ax in figure.axes if not ax.get_gid() and ax.get_ylabel() != "Layer"]
    top = run.needle[run.needle["press"] == "full"]["needle_mass"].max()
    assert bars == [f"Full cache's attention mass on the needle (0 to {top:.2g})",
                    "Share of the needle kept at r = 0.5 (0 to 1)"]


def test_the_survival_picture_of_every_default_press_wraps_into_rows(tmp_path) -> None:
    """The default list's 23 presses drew 24 panels in one row, 37 inches wide; rows of `SURVIVAL_ROW` now, without
    a matplotlib warning."""
    import warnings

    from spectra.kinds.pressbase import default_presses
    from spectra.report.evaluate import SURVIVAL_ROW

    run = task_run(tmp_path)
    knorm = run.needle[run.needle["press"] == "knorm"]
    needle = pd.concat([run.needle[run.needle["press"] == "full"],
                        *[knorm.assign(press=press) for press in default_presses()]], ignore_index=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = draw_survival(TaskRun(tmp_path, run.meta, run.examples, run.scores, run.lengths, needle,
                                       pd.DataFrame()), 0.5)
        figure.canvas.draw()
    panels = [ax for ax in figure.axes if ax.get_gid()]
    assert len(panels) == len(default_presses()) + 1
    rows = {round(ax.get_position().y0, 3) for ax in panels}
    assert len(rows) == -(-len(panels) // SURVIVAL_ROW)
    assert figure.get_figwidth() < 20
