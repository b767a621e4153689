"""Per-run views of an analyze run: files are written, and every plotted value is the run's stored value."""

from __future__ import annotations

import sys

import numpy as np
from report_helpers import ANALYZE_N as N
from report_helpers import axis_by_gid as by_gid
from report_helpers import mesh_values
from tiny import run_cli

from spectra import cli
from spectra.report import analyze as report


def test_plot_run_views(runs, tmp_path) -> None:
    run = runs["deep-wiki"]
    curves = report.draw_layer_curves(run)
    ax = by_gid(curves, "curves")
    assert len(ax.lines) == run.layers
    for layer, line in enumerate(ax.lines):
        assert line.get_gid() == f"layer:{layer}"
        np.testing.assert_allclose(line.get_ydata(), run.cum_mean[layer].mean(axis=0), rtol=1e-12)
    assert run.label in ax.get_title()

    heat = by_gid(report.draw_c_heatmap(run, at=N), "heatmap")
    np.testing.assert_allclose(mesh_values(heat), run.cum_mean[:, :, N - 1], rtol=0)
    assert "index 32" in heat.get_title()

    ranks = report.draw_rank_heatmaps(run)
    table = run.metrics.sort_values(["layer", "head"])
    for energy in (90, 99):
        expected = table[f"rank{energy}_mean"].to_numpy().reshape(run.layers, run.heads)
        np.testing.assert_array_equal(mesh_values(by_gid(ranks, f"rank{energy}")), expected)
        assert f"{energy}%" in by_gid(ranks, f"rank{energy}").get_title()

    attention = report.draw_attention_heatmaps(run)
    for name in ("sink", "entropy"):
        expected = table[f"{name}_mean"].to_numpy().reshape(run.layers, run.heads)
        np.testing.assert_array_equal(mesh_values(by_gid(attention, name)), expected)

    written = report.plot_run(run, tmp_path / "views")
    names = sorted(path.name for path in written.paths)
    assert names == ["c_at8.pdf", "c_at8.png", "curves.pdf", "curves.png", "rank.pdf", "rank.png",
                     "sink_entropy.pdf", "sink_entropy.png"], "an encoder run without qkv has no key-rank view"
    assert all(path.stat().st_size > 1000 for path in written.paths)


def rank_for(eigenvalues: np.ndarray, share: float = 0.9) -> np.ndarray:
    """The smallest r whose top r eigenvalues hold `share` of their sum, along the last axis."""
    descending = np.sort(eigenvalues, axis=-1)[..., ::-1]
    cum = np.cumsum(descending, axis=-1) / descending.sum(-1, keepdims=True)
    return (cum < share - 1e-12).sum(-1) + 1


def test_decoder_key_ranks_view(llama_dir, text_file, tmp_path) -> None:
    """Each line is the qkv column it names, and says what it is: the label "variance" goes to the centred rank
    (pca_rank90, recomputed here from the covariance eigenvalues of qkv.npz), "energy" to the uncentred ones
    (dataset_rank90 from the eigenvalues of Σkᵀk, and the per-sequence rank90_mean); the legend called
    dataset_rank90 the variance one."""
    import spectra

    run = spectra.analyze(str(llama_dir), str(text_file), length=16, samples=4, out=tmp_path / "run", progress=None,
                          notify=lambda line: None)
    figure = report.draw_key_ranks(run)
    ax = by_gid(figure, "key_ranks")
    keys = run.qkv[run.qkv["tensor"] == "k"]
    arrays = np.load(run.path / "qkv.npz")
    labels = {line.get_gid(): line.get_label() for line in ax.lines if line.get_gid()}
    for stage in ("projection", "attention"):
        for column in ("pca_rank90", "dataset_rank90", "rank90_mean"):
            line = next(line for line in ax.lines if line.get_gid() == f"{stage}:{column}")
            expected = keys[keys["stage"] == stage].groupby("layer")[column].mean().to_numpy()
            np.testing.assert_allclose(line.get_ydata(), expected, rtol=0)
        centred = rank_for(arrays[f"k_{stage}_pca_eigenvalues"]).mean(-1)
        uncentred = rank_for(arrays[f"k_{stage}_eigenvalues"]).mean(-1)
        drawn = {line.get_gid(): line.get_ydata() for line in ax.lines}
        np.testing.assert_allclose(drawn[f"{stage}:pca_rank90"], centred, rtol=1e-12)
        np.testing.assert_allclose(drawn[f"{stage}:dataset_rank90"], uncentred, rtol=1e-12)
        assert "variance" in labels[f"{stage}:pca_rank90"] and "energy" not in labels[f"{stage}:pca_rank90"]
        for column in ("dataset_rank90", "rank90_mean"):
            assert "energy" in labels[f"{stage}:{column}"] and "variance" not in labels[f"{stage}:{column}"]
    assert "key_ranks.png" in [path.name for path in report.plot_run(run, tmp_path / "views").paths]
    # the legend sits below the axes, so it covers no curve (inside the axes it hid the low layers' ranks)
    figure = report.draw_key_ranks(run)
    figure.canvas.draw()
    ax = by_gid(figure, "key_ranks")
    assert ax.get_legend() is None and len(figure.legends) == 1
    legend, frame = figure.legends[0].get_window_extent(), ax.get_window_extent()
    assert legend.y1 <= frame.y0 and not legend.overlaps(frame)
    texts = [text.get_text() for text in figure.legends[0].get_texts()]
    assert texts == ["over the run, 90% of the variance (centred: pca_rank90)",
                     "over the run, 90% of the energy Σkᵀk (uncentred: dataset_rank90)",
                     "per sequence, 90% of the energy (uncentred: rank90_mean)", "head dimension d = 8",
                     "before RoPE (W^K output)", "after RoPE (what attention sees)"]


def test_plot_without_out_writes_beside_the_run(runs, tmp_path, monkeypatch, capsys) -> None:
    """`spectra plot RUN` writes RUN/figures, never into the current directory (a clone's tracked figures/)."""
    import shutil

    run = shutil.copytree(runs["small-imdb"].path, tmp_path / "run")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    code, out, err = run_cli(["plot", str(run)], monkeypatch, capsys)
    assert code == 0, err
    assert sorted(p.name for p in (run / "figures").iterdir()) == [
        "c_at8.pdf", "c_at8.png", "curves.pdf", "curves.png", "rank.pdf", "rank.png", "sink_entropy.pdf",
        "sink_entropy.png"]
    assert list((tmp_path / "cwd").iterdir()) == []


def test_cli_plot(runs, tmp_path, monkeypatch, capsys) -> None:
    path = str(runs["small-imdb"].path)
    monkeypatch.setattr(sys, "argv", ["spectra", "plot", path, "--at", "3", "--out", str(tmp_path / "views")])
    cli.main()
    assert sorted(p.name for p in (tmp_path / "views").iterdir()) == [
        "c_at3.pdf", "c_at3.png", "curves.pdf", "curves.png", "rank.pdf", "rank.png", "sink_entropy.pdf",
        "sink_entropy.png"]
    capsys.readouterr()


def test_cli_plot_bad_input_is_one_line_and_exit_2(runs, tmp_path, monkeypatch, capsys) -> None:
    small = str(runs["small-wiki"].path)
    cases = {
        "at zero": (["plot", small, "--at", "0", "--out", str(tmp_path / "out")], "1…32"),
        "plot not a run": (["plot", str(tmp_path / "missing"), "--out", str(tmp_path / "out")], "no run.json"),
    }
    for name, (args, needle) in cases.items():
        code, stdout, stderr = run_cli(args, monkeypatch, capsys)
        assert code == 2, name
        assert stderr.startswith("error:") and stderr.count("\n") == 1 and needle in stderr, (name, stderr)
        assert not (tmp_path / "out").exists(), name
