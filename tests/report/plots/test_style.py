"""What every figure shares: output paths and saving, method styles from the registry, the log axis with its ▼
marks, the k axis, ticks, the heatmap."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from matplotlib.colors import to_hex
from report_helpers import cielab, mesh_values, visible_tick_labels

from spectra.errors import SpectraError
from spectra.methods import REGISTRY
from spectra.report.plots import style


def test_output_paths_drop_a_given_suffix_and_refuse_a_directory(tmp_path) -> None:
    for out in (tmp_path / "fig", tmp_path / "fig.png", tmp_path / "fig.PDF"):
        assert style.output_paths(out) == {"png": tmp_path / "fig.png", "pdf": tmp_path / "fig.pdf"}
    (tmp_path / "folder").mkdir()
    with pytest.raises(SpectraError, match="is a directory"):
        style.output_paths(tmp_path / "folder")


def test_save_writes_png_and_pdf_and_closes_the_figure(tmp_path) -> None:
    plt = style.pyplot()
    figure, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    paths = style.save(figure, tmp_path / "sub" / "line.png")
    assert paths == [tmp_path / "sub" / "line.png", tmp_path / "sub" / "line.pdf"]
    assert paths[0].read_bytes().startswith(b"\x89PNG") and paths[1].read_bytes().startswith(b"%PDF")
    assert figure.number not in plt.get_fignums()


def test_plot_folder_default_and_a_file_in_the_way(approx_run, tmp_path) -> None:
    assert style.plot_folder(approx_run, None) == approx_run.path / "figures", "beside the run, not in the cwd"
    assert style.plot_folder(approx_run, tmp_path / "views") == tmp_path / "views"
    (tmp_path / "file").write_text("")
    with pytest.raises(SpectraError, match="not a directory"):
        style.plot_folder(approx_run, tmp_path / "file")




def test_method_styles_come_from_the_registry_and_theorem2_keeps_its_own() -> None:
    for label, entry in REGISTRY.items():
        line = style.method_style(label, index=7)
        assert (line["color"], line["marker"], line["linestyle"]) == (entry.color, entry.marker, "-")
    assert style.method_style("svd")["color"] == "black"  # the Eckart–Young floor
    for label, (color, marker) in style.OTHER_STYLES.items():
        assert label not in REGISTRY
        line = style.method_style(label)
        assert (line["color"], line["marker"], line["linestyle"]) == (color, marker, "--")
    # an unknown label: the index-th spare colour and marker, distinct for neighbours
    spare = [style.method_style("something-new", index=i) for i in range(3)]
    assert len({to_hex(line["color"]) for line in spare}) == 3 and len({line["marker"] for line in spare}) == 3


def test_methods_of_different_families_are_told_apart_by_colour() -> None:
    """Two families' colours differ by ΔE ≥ 20 (CIELAB, 1976: about what tells two thin lines apart at a glance);
    pool-mean and linformer-fit(headwise) were two greens 17 apart, linformer(none) and linformer-pca(headwise)
    two blues 5 apart. The sharing levels of one family are shades of one hue, at least 12 apart."""
    from itertools import combinations

    for a, b in combinations(REGISTRY.values(), 2):
        distance = np.linalg.norm(cielab(a.color) - cielab(b.color))
        assert distance >= (12 if a.family == b.family else 20), (a.label, b.label, round(distance, 1))


def test_log_y_marks_values_under_the_axis() -> None:
    plt = style.pyplot()
    figure, axes = plt.subplots(1, 2, sharey=True)
    axes[0].plot([1, 2, 3], [0.5, 0.0, 1e-9], gid="exact")
    axes[1].plot([1, 2, 3], [2.0, 1.0, 0.1], gid="approx")
    assert style.log_y(axes, decades=3)
    bottom, top = axes[0].get_ylim()
    assert axes[1].get_ylim() == (bottom, top) and top == pytest.approx(2.0 * 1.6)
    assert bottom == pytest.approx(max(1e-9 / 1.6, 2.0 * 1e-3))
    (mark,) = [line for line in axes[0].lines if line.get_gid() == "below:exact"]
    assert list(mark.get_xdata()) == [2, 3] and list(mark.get_ydata()) == [bottom, bottom]
    assert list(axes[0].lines[0].get_ydata()) == [0.5, 0.0, 1e-9]  # the stored values stay in the line
    assert not [line for line in axes[1].lines if line.get_gid() == "below:approx"]
    handles, labels = style.below_entry([], [], True)
    assert labels == ["below the axis (≈ 0: exact)"] and style.below_entry([], [], False) == ([], [])
    plt.close(figure)


def test_maybe_log_y_only_for_a_wide_range() -> None:
    plt = style.pyplot()
    figure, (narrow, wide) = plt.subplots(1, 2)
    narrow.plot([1, 2], [100.0, 300.0])
    wide.plot([1, 2], [1.0, 10.0])
    assert not style.maybe_log_y(narrow) and narrow.get_yscale() == "linear"
    style.maybe_log_y(wide)
    assert wide.get_yscale() == "log"
    plt.close(figure)


def test_plain_log_ticks_on_wide_and_narrow_ranges() -> None:
    """Over three decades: decades only (1, 10, 100, 1000); under a factor of 4: every integer multiple."""
    plt = style.pyplot()
    for (low, high), expected in (((1.0, 1000.0), [1, 10, 100, 1000]), ((21.0, 62.0), [30, 40, 50, 60])):
        figure, ax = plt.subplots()
        ax.plot([1, 2], [low, high])
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        style.plain_log_ticks(ax)
        figure.canvas.draw()
        labels = visible_tick_labels(ax.yaxis, low, high)
        assert sorted(labels) == pytest.approx(expected) and all(float(t) == v for v, t in labels.items())
        plt.close(figure)


def test_k_axis_ticks_every_budget_on_a_log2_axis() -> None:
    plt = style.pyplot()
    figure, ax = plt.subplots()
    low, high = style.k_axis(ax, [32, 8, 16, 8], "Budget k")
    assert (low, high) == (8 / 1.25, 32 * 1.25) and ax.get_xlim() == pytest.approx((low, high))
    assert list(ax.get_xticks()) == [8, 16, 32] and ax.get_xscale() == "log" and ax.get_xlabel() == "Budget k"
    plt.close(figure)


def test_ticks_are_thinned_and_index_ticks_are_the_papers() -> None:
    assert list(style.ticks(12)) == list(range(12))
    assert list(style.ticks(40, most=16)) == list(range(0, 40, math.ceil(40 / 16)))
    assert style.index_ticks(512) == [0, 128, 512] and style.index_ticks(2) == [0, 0.5, 2]


def test_draw_heatmap_layer_down_head_across_with_labels() -> None:
    plt = style.pyplot()
    figure, ax = plt.subplots()
    values = np.array([[0.1, 0.9, 0.5], [0.7, 0.2, 0.3]])
    style.draw_heatmap(ax, values, title="t", colorbar="c", digits=2)
    np.testing.assert_array_equal(mesh_values(ax), values)
    assert ax.get_gid() == "heatmap" and ax.get_ylim() == (1.5, -0.5) and ax.get_xlim() == (-0.5, 2.5)
    texts = {(text.get_position(), text.get_text()): text.get_color() for text in ax.texts}
    assert texts[((1, 0), "0.90")] == "black" and texts[((0, 0), "0.10")] == "white"  # contrast with the cell
    assert len(texts) == values.size
    plt.close(figure)


def test_subtitle(runs) -> None:
    run = runs["small-wiki"]
    assert style.subtitle(run, run.n) == f"{run.label}, n = 32, 16 sequences"
    calibrated = copy.copy(run)
    calibrated.meta = {**run.meta, "samples": 32, "sequences": 96, "evaluation": [64, 96]}
    assert style.subtitle(calibrated, 128) == f"{run.label}, n = 128, 32 held-out sequences (64 calibrated)"
    calibrated.meta = {**run.meta, "samples": 16, "sequences": 80, "evaluation": [64, 96]}
    assert style.subtitle(calibrated, 128).endswith(", 16 held-out sequences (64 calibrated)")


def test_a_long_title_is_broken_at_spaces_and_its_own_line_breaks_kept() -> None:
    title = "SmolLM2: mean score over 250 examples of 5 tasks the full cache answers (niah_single_1, passkey)\nleft"
    lines = style.title_lines(title, 40).splitlines()
    assert all(len(line) <= 40 for line in lines) and lines[-1] == "left"
    assert " ".join(lines[:-1]) == title.splitlines()[0]  # every word kept, in order
    assert style.title_lines("short", 40) == "short" and style.title_lines("a_single_word_longer_than_it", 5) == \
        "a_single_word_longer_than_it"


def test_a_press_label_drops_folders_and_puts_a_long_argument_on_its_own_line() -> None:
    assert style.press_label("kvzap(artifacts/kvzap-mlp)", 18) == "kvzap(kvzap-mlp)"
    assert style.press_label("criticaladakv(expected_attention)", 18) == "criticaladakv\n(expected_attention)"
    assert style.press_label("mixed(/tmp/w/runs/axes-smol)", 30) == "mixed(axes-smol)"
    assert style.press_label("snapkv", 3) == "snapkv" and style.press_label("composed(snapkv,think)", 40) == \
        "composed(snapkv,think)"


def test_a_label_is_as_wide_as_its_longest_line() -> None:
    assert style.label_inches(["criticaladakv\n(expected_attention)", "knorm"]) == pytest.approx(
        style.INCHES_PER_CHARACTER * len("(expected_attention)"))
    assert style.label_inches([]) == 0.0


def test_labels_are_raised_until_no_two_overlap() -> None:
    x, y = np.array([0.1, 0.1, 0.5, 0.12]), np.array([0.2, 0.2, 0.2, 0.21])
    widths, height = [0.2, 0.2, 0.2, 0.2], 0.03
    heights = style.label_heights(x, y, widths, height)
    assert heights[2] == 0.2  # alone in its column: where its point is
    assert heights.min() >= y.min() and (heights >= y).all()  # labels only rise
    boxes = [(x[i], x[i] + widths[i], heights[i]) for i in range(len(x))]
    for i, (left, right, bottom) in enumerate(boxes):
        for other_left, other_right, other_bottom in boxes[i + 1:]:
            if left < other_right and other_left < right:
                assert abs(bottom - other_bottom) >= height - 1e-12

