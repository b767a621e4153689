"""Views of a heads run: the scatter holds each head's weight and attention rank90, the type grid each head's
type, the winner grid each head's winning method."""

from __future__ import annotations

import numpy as np
import pytest
from report_helpers import DICHROMACY, by_gid, cielab, fake_save, seen_by

import spectra
from spectra.anatomy.methodmap import HEAD_TYPES
from spectra.report.heads import draw_head_types, draw_weight_ranks, draw_winners, plot_heads


@pytest.fixture(scope="module")
def heads_run(roberta_dir, text_file, tmp_path_factory):
    base = tmp_path_factory.mktemp("heads-plots")
    approx = spectra.approx(str(roberta_dir), str(text_file), length=16, samples=2, budget=[4, 8],
                            methods="window,pool-mean", out=base / "approx", progress=None, notify=lambda line: None)
    return spectra.heads(str(roberta_dir), str(text_file), length=16, samples=2, approx=approx.path,
                         out=base / "heads", progress=None, notify=lambda line: None)


def test_the_scatter_draws_weight_and_attention_ranks(heads_run) -> None:
    figure = draw_weight_ranks(heads_run)
    table = heads_run.diagnosis
    for name in ("qk", "ov"):
        points = by_gid([c for ax in figure.axes for c in ax.collections], name).get_offsets()
        np.testing.assert_array_equal(points[:, 0], table[f"{name}_rank90"])
        np.testing.assert_array_equal(points[:, 1], table["rank90"])


def test_the_legend_covers_no_point(heads_run) -> None:
    """The legend sits outside both panels, so it covers no head; checked with a head moved to where it hid
    MiniLM's L0H2 (a low weight rank, the highest attention rank: the upper left corner)."""
    import copy

    moved = copy.copy(heads_run)
    diagnosis = heads_run.diagnosis.copy()
    diagnosis.loc[0, ["qk_rank90", "ov_rank90"]] = 0.5
    diagnosis.loc[0, "rank90"] = diagnosis["rank90"].max() * 1.2
    moved.diagnosis = diagnosis
    figure = draw_weight_ranks(moved)
    figure.canvas.draw()
    panels = [ax for ax in figure.axes if ax.collections and ax.collections[0].get_gid() in ("qk", "ov")]
    assert len(panels) == 2 and all(ax.get_legend() is None for ax in panels)
    (legend,) = figure.legends
    box = legend.get_window_extent()
    assert "y = x" in [text.get_text() for text in legend.get_texts()]
    for ax in panels:
        assert not box.overlaps(ax.get_window_extent())
        points = ax.transData.transform(ax.collections[0].get_offsets())
        assert not [point for point in points if box.contains(*point)]


def test_the_grids_hold_each_head_s_type_and_winner(heads_run) -> None:
    image = by_gid(draw_head_types(heads_run).axes[0].images, "types").get_array()
    table = heads_run.diagnosis
    for row in table.itertuples(index=False):
        assert HEAD_TYPES[int(image[row.layer, row.head])] == row.head_type
    figure = draw_winners(heads_run)
    mapped = heads_run.method_map
    methods = sorted(mapped["winner"].unique())
    for budget in (4, 8):
        grid = by_gid([i for ax in figure.axes for i in ax.images], f"winners:{budget}").get_array()
        for row in mapped[mapped["budget"] == budget].itertuples(index=False):
            assert methods[int(grid[row.layer, row.head])] == row.winner


def test_the_head_types_stay_apart_for_colour_blind_readers(heads_run) -> None:
    """Issue 41, item 15: sink and local were red and green (ΔE 7 for a deuteranope, orange and green 5 for a
    protanope). Every two types' colours, as drawn, now differ by ΔE ≥ 15 (CIELAB) for every dichromacy."""
    from itertools import combinations

    from matplotlib.colors import to_hex

    image = by_gid(draw_head_types(heads_run).axes[0].images, "types")
    drawn = [to_hex(image.get_cmap()(index)) for index in range(len(HEAD_TYPES))]
    for (a, one), (b, other) in combinations(zip(HEAD_TYPES, drawn), 2):
        assert np.linalg.norm(cielab(one) - cielab(other)) >= 15, (a, b)
        for dichromacy in DICHROMACY:
            distance = np.linalg.norm(cielab(seen_by(one, dichromacy)) - cielab(seen_by(other, dichromacy)))
            assert distance >= 15, (a, b, dichromacy, round(distance, 1))


def test_plot_heads_writes_three_views(heads_run, monkeypatch, tmp_path) -> None:
    saved = fake_save(monkeypatch)
    paths = plot_heads(heads_run, tmp_path / "views")
    assert [path.name for path in paths] == ["weight_vs_attention_rank.png", "weight_vs_attention_rank.pdf",
                                             "head_types.png", "head_types.pdf", "winners.png", "winners.pdf"]
    assert len(saved) == 3


def test_the_printout_is_a_summary_and_all_prints_every_head(heads_run, monkeypatch, capsys) -> None:
    """Issue 41, item 14: `spectra heads` printed the whole diagnosis, three 270-row tables at 80 columns on SmolLM2
    (836 lines). By default it prints per layer the count of each head type and the mean rank90, and each score's
    three strongest heads (each within 80 columns); --all prints every head, as before, on a saved run too."""
    from report_helpers import printed_tables
    from tiny import run_cli

    from spectra.report import console
    from spectra.report.heads import show

    monkeypatch.setattr(console.out, "width", 80)
    show(heads_run)
    printed = capsys.readouterr().out
    assert max(len(line) for line in printed.splitlines()) <= 80
    layers, strongest = printed_tables(printed)
    table = heads_run.diagnosis
    assert layers["header"] == [["layer", "induction", "prev", "sink", "local", "retrieval", "mixed", "rank90"]]
    assert len(layers["rows"]) == heads_run.layers
    for layer, row in enumerate(layers["rows"]):
        mine = table[table["layer"] == layer]
        assert row[1:7] == [str(int((mine["head_type"] == kind).sum())) for kind in HEAD_TYPES]
        assert row[7] == f"{mine['rank90'].mean():.1f}"
    scores = {row[0]: row[1] for row in strongest["rows"]}
    for score in ("sink_share", "prev", "local", "retrieval"):
        ranked = sorted(table.itertuples(), key=lambda head: -getattr(head, score))[:3]
        assert scores[score] == ", ".join(f"L{head.layer}H{head.head} {getattr(head, score):.2f}" for head in ranked)
    assert "induction_score" not in scores, "an encoder's induction score is not measured"
    assert "--all prints them" in " ".join(printed.split())
    for argv, rows in (([], heads_run.layers), (["--all"], len(table))):
        code, out, err = run_cli(["heads", str(heads_run.path), *argv], monkeypatch, capsys)
        assert code == 0, err
        assert len(printed_tables(out)[0]["rows"]) == rows
    assert printed_tables(out)[0]["header"][0][:3] == ["layer", "head", "head_type"]
