"""Figure 1: files are written, and every plotted value is the run's stored value."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from report_helpers import ANALYZE_N as N
from report_helpers import axis_by_gid as by_gid
from report_helpers import mesh_values
from tiny import run_cli

from spectra import cli
from spectra.report import plots


def quantile(values: np.ndarray, q: float) -> float:
    """Linear-interpolation quantile written out: sorted values, position q·(m − 1)."""
    ordered = sorted(float(x) for x in values)
    position = q * (len(ordered) - 1)
    lower = int(np.floor(position))
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (position - lower) * (ordered[upper] - ordered[lower])


def test_figure1_panels_curves_bands_and_heatmap(runs) -> None:
    order = [runs["deep-imdb"], runs["deep-wiki"], runs["small-imdb"], runs["small-wiki"]]
    figure = plots.draw_figure1(order)
    # one panel per depth, shallowest first, then the heatmap
    assert [ax.get_gid() for ax in figure.axes[:3]] == ["curves:2", "curves:3", "heatmap"]
    for depth in (2, 3):
        ax = by_gid(figure, f"curves:{depth}")
        assert list(ax.get_xticks()) == [0, N / 4, N] and ax.get_xlim() == (0, N)
        assert ax.get_xlabel() == "Singular value index"
        assert ax.get_ylabel() == "Normalized cumulative singular value"
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        members = [run for run in order if run.layers == depth]
        assert legend == [run.label for run in members]
        assert ax.get_legend().get_title().get_text() == "line: mean; band: 10–90% of layer×head curves"
        assert all(run.meta["model"]["name"] in text and run.meta["data"]["name"] in text
                   for run, text in zip(members, legend))
        for run in members:
            curves = run.cum_mean.reshape(run.layers * run.heads, run.n)
            (line,) = [line for line in ax.lines if line.get_gid() == f"mean:{run.path}"]
            np.testing.assert_array_equal(line.get_xdata(), np.arange(1, N + 1))
            np.testing.assert_allclose(line.get_ydata(), curves.mean(axis=0), rtol=1e-12)
            (band,) = [c for c in ax.collections if c.get_gid() == f"band:{run.path}"]
            points = band.get_paths()[0].vertices
            for j in (1, 2, N // 4, N - 1):
                at_j = points[np.isclose(points[:, 0], j), 1]
                expected = [quantile(curves[:, j - 1], 0.1), quantile(curves[:, j - 1], 0.9)]
                np.testing.assert_allclose([at_j.min(), at_j.max()], expected, rtol=1e-12)
    # heatmap default: the first Wikitext run among the shallowest (2-layer) runs, at index n/4
    heat = by_gid(figure, "heatmap")
    run = runs["small-wiki"]
    assert run.label in heat.get_title() and "index 8" in heat.get_title()
    stored = run.metrics.sort_values(["layer", "head"])["c_at_mean"].to_numpy().reshape(run.layers, run.heads)
    np.testing.assert_array_equal(mesh_values(heat), stored)
    assert heat.get_ylim() == (run.layers - 0.5, -0.5)  # layer 0 on top
    assert heat.get_xlabel() == "Head index" and heat.get_ylabel() == "Layer index"


def test_figure1_legend_shows_each_band_in_its_run_s_colour(runs) -> None:
    """A run's legend entry is its band and its line, both in the run's colour; no entry is a grey band (the bands
    take each run's colour, and the grey entry stood for none of them)."""
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    order = [runs["small-imdb"], runs["small-wiki"]]
    figure = plots.draw_figure1(order)
    ax = by_gid(figure, "curves:2")
    figure.canvas.draw()
    legend = ax.get_legend()
    patches = [to_rgba(patch.get_facecolor()) for patch in legend.findobj(Rectangle)]
    lines = [to_rgba(line.get_color()) for line in legend.findobj(Line2D) if line.get_linestyle() != "None"]
    bands, means = [], []
    for run in order:
        (band,) = [c for c in ax.collections if c.get_gid() == f"band:{run.path}"]
        (line,) = [line for line in ax.lines if line.get_gid() == f"mean:{run.path}"]
        bands.append(to_rgba(band.get_facecolor()[0]))
        means.append(to_rgba(line.get_color()))
        assert bands[-1][:3] == pytest.approx(means[-1][:3])  # the band in its run's colour
    assert len(set(means)) == len(order)
    np.testing.assert_allclose(patches, bands, rtol=1e-12)
    np.testing.assert_allclose(lines, means, rtol=1e-12)
    assert not [colour for colour in patches if colour[0] == colour[1] == colour[2]], "no grey band in the legend"


def test_figure1_heatmap_run_and_index_can_be_chosen(runs) -> None:
    chosen = runs["deep-imdb"]
    figure = plots.draw_figure1([runs["small-wiki"], chosen], heatmap=chosen, at=5)
    values = mesh_values(by_gid(figure, "heatmap"))
    assert values.shape == (3, 4)
    np.testing.assert_allclose(values, chosen.cum_mean[:, :, 4], rtol=0)
    # no Wikitext run among the shallowest: the first run
    assert plots.choose_heatmap([runs["deep-wiki"], runs["small-imdb"]]) is runs["deep-wiki"]
    assert plots.choose_heatmap([runs["deep-imdb"], runs["small-wiki"], runs["small-imdb"]]) is runs["small-wiki"]


def test_figure1_writes_200_dpi_png_and_vector_pdf(runs, tmp_path) -> None:
    from PIL import Image

    paths = plots.figure1([run for run in runs.values() if run.n == N], tmp_path / "fig" / "figure1.png")
    assert paths == [tmp_path / "fig" / "figure1.png", tmp_path / "fig" / "figure1.pdf"]
    with Image.open(paths[0]) as image:
        assert image.info["dpi"][0] == pytest.approx(200, abs=1) and image.size[0] > 1500
    pdf = paths[1].read_bytes()
    # vector: the heatmap cells are paths; the only bitmap allowed is the colour bar's gradient,
    # which matplotlib rasterizes on purpose (to avoid seams between its many colour steps)
    assert pdf.startswith(b"%PDF") and pdf.count(b"/Subtype /Image") <= 1


def test_cli_figure1(runs, tmp_path, monkeypatch, capsys) -> None:
    paths = [str(runs[key].path) for key in ("small-wiki", "small-imdb", "deep-wiki", "deep-imdb")]
    monkeypatch.setattr(sys, "argv", ["spectra", "figure1", *paths, "--out", str(tmp_path / "f1"), "--heatmap", paths[2]])
    cli.main()
    assert (tmp_path / "f1.png").is_file() and (tmp_path / "f1.pdf").is_file()
    capsys.readouterr()


def test_cli_figure1_bad_input_is_one_line_and_exit_2(runs, tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "not-a-run").mkdir()
    small, mixed = str(runs["small-wiki"].path), str(runs["small-imdb-n16"].path)
    out = tmp_path / "out" / "figure"
    cases = {
        "not a run": (["figure1", str(tmp_path / "not-a-run"), "--out", str(out)], "no run.json"),
        "different n in one panel": (["figure1", small, mixed, "--out", str(out)], "different n"),
        "at too large": (["figure1", small, "--at", str(N + 1), "--out", str(out)], "1…32"),
        "band": (["figure1", small, "--band", "0.6", "--out", str(out)], "--band"),
    }
    for name, (args, needle) in cases.items():
        code, stdout, stderr = run_cli(args, monkeypatch, capsys)
        assert code == 2, name
        assert stderr.startswith("error:") and stderr.count("\n") == 1 and needle in stderr, (name, stderr)
        assert not (tmp_path / "out").exists(), name
