"""The view of a cache run: every plotted value is the run's table (NLL per press, starting from the full cache at
ratio 0) or the per-head table averaged here with pandas; channel presses stay out of the mass panel."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
from matplotlib.colors import to_hex
from report_helpers import by_gid, cielab, fake_save

from spectra.registry import PRESSES as REGISTERED

#: the presses of the default run (a name with an argument, adakv(snapkv) or decoding(knorm), is drawn apart)
ALONE = list(REGISTERED.bare())  # the presses named alone (those with an argument take spare styles)
CHANNELS = {press for press in REGISTERED if REGISTERED.facts(press)["axis"] == "channels"}  # think: key channels
from spectra.report.cache import PRESS_STYLES, CacheRun, draw_cache, plot_cache, press_style
from spectra.report.plots.style import pyplot


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


def every_press_run(tmp_path) -> CacheRun:
    """A run of every registered press (the default `spectra cache`), at two ratios: think and lowrank keep
    every token (kept_share 1), linformer's rows are not tokens (mass NaN), as `spectra cache` writes them."""
    rng = np.random.default_rng(1)
    variants = [("full", 0.0)] + [(press, ratio) for press in ALONE for ratio in (0.25, 0.5)]
    table = pd.DataFrame([{"press": press, "ratio": ratio, "nll": 3 + ratio + rng.uniform(), "ppl": 0.0,
                           "kept_share": 1.0 if press in ("think", "lowrank") else 1 - ratio,
                           "key_channel_ratio": ratio if press in CHANNELS else 0.0}
                          for press, ratio in variants])
    heads = pd.DataFrame([{"press": press, "ratio": ratio, "layer": 0, "head": head,
                           "mass_kept": 1.0 if press == "full" else np.nan if press == "linformer" else rng.uniform(),
                           "out_err": rng.uniform()} for press, ratio in variants for head in range(2)])
    meta = {"kind": "cache", "model": {"name": "tiny"}, "data": {"name": "corpus"}, "context": 128,
            "continuation": 16, "scored": 1}
    return CacheRun(tmp_path, meta, table, heads, pd.DataFrame())


def test_every_press_has_its_own_colour_and_marker(tmp_path) -> None:
    """The default run draws 11 presses; tab10 has 10 colours, so streaming and linformer were the same blue
    circles. Now every press differs from every other by colour (ΔE ≥ 15 in CIELAB, then ≥ 25 once the default list
    grew to 23: issue 55, item 4) and by marker, and no press is drawn in the full cache's grey."""
    left, right = draw_cache(every_press_run(tmp_path)).axes
    lines = {press: by_gid(left.lines, f"nll:{press}") for press in ALONE}
    markers = [line.get_marker() for line in lines.values()]
    assert len(set(markers)) == len(ALONE), markers
    for (a, one), (b, other) in combinations(lines.items(), 2):
        distance = np.linalg.norm(cielab(one.get_color()) - cielab(other.get_color()))
        assert distance >= 25, (a, b, round(distance, 1))
    full = by_gid(left.lines, "full")
    for press, line in lines.items():
        assert np.linalg.norm(cielab(line.get_color()) - cielab(full.get_color())) >= 25, press
        mass = [item for item in right.lines if item.get_gid() == f"mass:{press}"]
        if mass:  # the same style in both panels
            assert (to_hex(mass[0].get_color()), mass[0].get_marker()) == (to_hex(line.get_color()), line.get_marker())


def test_each_panel_has_its_own_legend_off_the_data(tmp_path) -> None:
    """Each panel names what it draws (the right one had no legend), and no legend covers a panel."""
    figure = draw_cache(every_press_run(tmp_path))
    left, right = figure.axes
    figure.canvas.draw()
    for ax, prefix in ((left, "nll:"), (right, "mass:")):
        legend = ax.get_legend()
        assert legend is not None, prefix
        drawn = [line.get_label() for line in ax.lines if str(line.get_gid()).startswith(prefix)]
        labels = [text.get_text() for text in legend.get_texts()]
        assert set(drawn) <= set(labels)
        box = legend.get_window_extent()
        for other in (left, right):
            assert not box.overlaps(other.get_window_extent()), (prefix, other)
    assert "full cache" in [text.get_text() for text in left.get_legend().get_texts()]
    drawn = {line.get_gid().removeprefix("mass:") for line in right.lines}
    assert drawn == set(ALONE) - {"think", "lowrank", "linformer"}
    assert right.get_legend().get_title().get_text() == ("not drawn: think, lowrank (every token kept); linformer "
                                                         "(rows are not tokens)")


def test_a_press_the_styles_do_not_know_gets_a_spare_style() -> None:
    known = set(PRESS_STYLES.values())  # a press they do not list (yet), or a name with an argument, takes a spare
    spare = [press_style(f"new{i}", index=i) for i in range(3)]
    assert len(set(spare)) == 3 and not set(spare) & known


def test_the_title_counts_its_sequences_in_words(tmp_path) -> None:
    """Issue 33, item 16: one sequence is "1 sequence", never "1 sequences"."""
    run = cache_run(tmp_path)
    for scored, words in ((1, "1 sequence"), (3, "3 sequences")):
        run.meta["scored"] = scored
        figure = draw_cache(run)
        assert figure._suptitle.get_text().endswith(f"continuation 8, {words}")
        pyplot().close(figure)


def test_a_decoding_press_is_drawn_dashed_in_its_scorers_style(tmp_path) -> None:
    """decoding(knorm) beside knorm: knorm's colour and marker, a dashed line; its mass (NaN: its cache changes while
    decoding) is not drawn, and the legend says why."""
    run = every_press_run(tmp_path)
    extra = pd.DataFrame([{"press": "decoding(knorm)", "ratio": ratio, "nll": 3.5 + ratio, "ppl": 0.0,
                           "kept_share": 1 - ratio, "key_channel_ratio": 0.0} for ratio in (0.25, 0.5)])
    heads = pd.DataFrame([{"press": "decoding(knorm)", "ratio": ratio, "layer": 0, "head": head, "mass_kept": np.nan,
                           "out_err": np.nan} for ratio in (0.25, 0.5) for head in range(2)])
    run = CacheRun(tmp_path, run.meta, pd.concat([run.table, extra], ignore_index=True),
                   pd.concat([run.head_stats, heads], ignore_index=True), pd.DataFrame())
    left, right = draw_cache(run).axes
    mine, scorer = by_gid(left.lines, "nll:decoding(knorm)"), by_gid(left.lines, "nll:knorm")
    assert (to_hex(mine.get_color()), mine.get_marker()) == (to_hex(scorer.get_color()), scorer.get_marker())
    assert mine.get_linestyle() == "--" and scorer.get_linestyle() == "-"
    assert "mass:decoding(knorm)" not in {line.get_gid() for line in right.lines}
    assert right.get_legend().get_title().get_text().endswith("decoding(knorm) (compressed while decoding)")


def memory_run(tmp_path) -> CacheRun:
    """knorm, lowrank (its bytes count its basis and mean: bytes_share above 1 − saved) and kivi4 (the same at
    every ratio) at three ratios, with the columns `spectra cache` writes."""
    rng = np.random.default_rng(2)
    rows = [{"press": "full", "ratio": 0.0, "nll": 3.0, "ppl": np.exp(3.0), "kl": 0.0, "top1": 1.0, "kept": 70.0,
             "kept_share": 1.0, "key_channel_ratio": 0.0, "saved": 0.0, "bytes_share": 1.0}]
    kivi = {"nll": 3.01, "kl": 0.002, "top1": 0.99, "kept": 70.0, "kept_share": 1.0, "saved": 0.72, "bytes_share": 0.28}
    for ratio in (0.25, 0.5, 0.75):
        nll = 3 + ratio + rng.uniform()
        rows.append({"press": "knorm", "ratio": ratio, "nll": nll, "ppl": np.exp(nll), "kl": ratio, "top1": 1 - ratio,
                     "kept": 70 * (1 - ratio), "kept_share": 1 - ratio, "key_channel_ratio": 0.0, "saved": ratio,
                     "bytes_share": 1 - ratio})
        rows.append({"press": "lowrank", "ratio": ratio, "nll": nll + 0.5, "ppl": np.exp(nll + 0.5), "kl": ratio,
                     "top1": 1 - ratio, "kept": 70.0, "kept_share": 1.0, "key_channel_ratio": 0.0, "saved": ratio,
                     "bytes_share": 1 - ratio + 0.13})
        rows.append({"press": "kivi4", "ratio": ratio, "ppl": np.exp(3.01), "key_channel_ratio": 0.0, **kivi})
    table = pd.DataFrame(rows)
    heads = pd.DataFrame([{"press": row.press, "ratio": row.ratio, "layer": 0, "head": 0,
                           "mass_kept": 1.0 if row.kept_share == 1 else row.kept_share, "out_err": 0.1}
                          for row in table.itertuples()])
    meta = {"kind": "cache", "model": {"name": "tiny"}, "data": {"name": "corpus"}, "context": 70,
            "continuation": 8, "scored": 2}
    return CacheRun(tmp_path, meta, table, heads, pd.DataFrame())


def test_the_cache_table_prints_a_ratio_free_press_once_and_says_what_saved_and_bytes_count(tmp_path, capsys) -> None:
    """Issue 41: kivi, which ignores the ratio, was printed once per ratio (item 10), and the table's saved and
    bytes_share disagreed for lowrank (0.500 against 0.629) without a word (item 12)."""
    from report_helpers import printed_tables

    from spectra.report.cache import show

    run = memory_run(tmp_path)
    show(run)
    printed = capsys.readouterr().out
    (table,) = printed_tables(printed)
    assert [row[:2] for row in table["rows"]] == [["full", "0.00"], ["knorm", "0.25"], ["lowrank", "0.25"],
                                                 ["kivi4", "any"], ["knorm", "0.50"], ["lowrank", "0.50"],
                                                 ["knorm", "0.75"], ["lowrank", "0.75"]]
    kivi = next(row for row in table["rows"] if row[0] == "kivi4")
    assert kivi[2:] == ["3.0100", f"{np.exp(3.01):.3f}", "0.0020", "0.990", "70.0", "0.720", "0.280"]
    words = " ".join(printed.split())
    assert ("kivi4: the same at every ratio (0.25, 0.5, 0.75), so one row each (ratio 'any'; cache.csv keeps a row "
            "per ratio)") in words
    assert "saved: the share of the cache a press reports removing, as kvpress reports a compression ratio" in words
    assert "the coefficients lowrank drops, its basis and mean not counted" in words
    assert "bytes_share: the bytes the compressed context cache stores over the full cache's" in words


def test_a_press_is_the_same_at_every_ratio_only_when_every_row_is() -> None:
    from spectra.report.cache import same_at_every_ratio

    rows = [{"press": press, "ratio": ratio, "task": task, "score": score}
            for press, ratio, task, score in [("full", 0.0, "a", 1.0), ("full", 0.0, "b", 1.0),
                                              ("kivi4", 0.5, "a", 1.0), ("kivi4", 0.75, "a", 1.0),
                                              ("kivi4", 0.5, "b", 0.5), ("kivi4", 0.75, "b", 0.5),
                                              ("knorm", 0.5, "a", 1.0), ("knorm", 0.75, "a", 1.0),
                                              ("knorm", 0.5, "b", 1.0), ("knorm", 0.75, "b", 0.0),
                                              ("tova", 0.5, "a", 1.0), ("tova", 0.5, "b", 1.0)]]
    table = pd.DataFrame(rows)
    assert same_at_every_ratio(table, ["score"], ("task",)) == ["kivi4"], "knorm differs on b; tova has one ratio"
    nan = table.assign(score=np.where(table["press"] == "kivi4", np.nan, table["score"]))
    assert same_at_every_ratio(nan, ["score"], ("task",)) == ["kivi4"], "empty cells count as equal"


def test_every_press_is_drawn_at_the_bytes_it_stores_and_a_ratio_free_press_as_one_point(tmp_path) -> None:
    """Issue 41, item 10: kivi2/4/8 were drawn at x = ratio on an axis of "the ratio of the cache removed", though
    kivi ignores the ratio (it stores 0.28 of the bytes here at every ratio), and lowrank at its ratio though it
    stores more. Now every cell sits at the share of the bytes it stores (the full cache at 1, on the left), each
    line starts from the full cache, and kivi4 is one marker, no line."""
    run = memory_run(tmp_path)
    left, right = draw_cache(run).axes
    table = run.table
    for ax in (left, right):
        assert ax.get_xlabel() == "Share of the full cache's bytes stored"
        assert ax.xaxis_inverted(), "less memory to the right, as compression grew to the right before"
    for press in ("knorm", "lowrank"):
        rows = table[table["press"] == press].sort_values("ratio")
        line = by_gid(left.lines, f"nll:{press}")
        np.testing.assert_array_equal(line.get_xdata(), [1.0, *rows["bytes_share"]])
        np.testing.assert_array_equal(line.get_ydata(), [3.0, *rows["nll"]])
    kivi = by_gid(left.lines, "nll:kivi4")
    assert list(kivi.get_xdata()) == [0.28] and list(kivi.get_ydata()) == [3.01]
    assert kivi.get_linestyle() == "None" and kivi.get_label() == "kivi4 (any ratio)"
    assert kivi.get_zorder() > by_gid(left.lines, "full").get_zorder(), "not hidden under the full cache's line"
    mass = by_gid(right.lines, "mass:knorm")
    np.testing.assert_array_equal(mass.get_xdata(), [1.0, 0.75, 0.5, 0.25])


def test_the_axis_map_s_cell_text_is_readable(tmp_path) -> None:
    """Issue 41, item 15: the axis map's numbers were 5.5-point black text, unreadable (and dark on the bits
    purple). Now 8 points, black or white for a WCAG contrast of at least 4.5 on each cell's colour, and a key/value
    head's query-head types with their repeats counted, so they fit the cell."""
    from spectra.report.cache import AXIS_COLOURS, draw_axes

    rows = [{"budget": budget, "layer": layer, "kv_head": head, "axis": axis, "out_err": 0.1 * (layer + head),
             "best": axis == ("bits" if (layer + head) % 2 else "tokens" if layer else "rank"),
             "head_types": "sink+sink+local"}
            for budget in (0.3, 0.6) for layer in range(3) for head in range(2) for axis in ("tokens", "rank", "bits")]
    run = CacheRun(tmp_path, {"model": {"name": "tiny"}, "data": {"name": "corpus"}, "context": 70}, pd.DataFrame(),
                   pd.DataFrame(), pd.DataFrame(), pd.DataFrame(rows))
    figure = draw_axes(run)

    def luminance(colour) -> float:
        from matplotlib.colors import to_rgb

        rgb = np.array(to_rgb(colour))
        return float(np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4) @ [0.2126, 0.7152, 0.0722])

    texts = [text for ax in figure.axes for text in ax.texts if str(text.get_gid()).startswith("cell:")]
    assert len(texts) == 2 * 3 * 2
    best = pd.DataFrame(rows)[pd.DataFrame(rows)["best"]]
    for text in texts:
        x, y = text.get_position()
        budget = float(text.get_gid().removeprefix("cell:"))
        cell = best[(best["budget"] == budget) & (best["layer"] == y) & (best["kv_head"] == x)].iloc[0]
        assert text.get_fontsize() >= 8
        assert text.get_text() == f"{cell['out_err']:.2f}\nsink×2+local"
        light, dark = sorted([luminance(text.get_color()), luminance(AXIS_COLOURS[cell["axis"]])], reverse=True)
        assert (light + 0.05) / (dark + 0.05) >= 4.5, (cell["axis"], text.get_color())
