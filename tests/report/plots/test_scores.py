"""The task study's score figure (`spectra evaluate --plot`'s task_scores) with many presses: issue 55, item 4. With 9
presses the panels' legends and "the same scores" notes ran into the neighbouring panels, constrained layout gave
up ("axes sizes collapsed to zero") leaving each axis a fifth of its panel, and greens and olives were alike. Now one
key below the panels, sized to its entries, names every press once; the panels grow with the presses; every press
of the default list has its own marker and a colour ΔE ≥ 25 (CIELAB) from every other and from the full cache's."""

from __future__ import annotations

import io
import warnings
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from report_helpers import by_gid, cielab

from spectra.kinds.pressbase import default_presses
from spectra.kv.tasks.summary import task_scores
from spectra.report.evaluate import TaskRun, draw_scores
from spectra.report.plots.style import pyplot

TASKS = ("passkey", "vt", "niah_single_1", "qa_1")
RATIOS = (0.25, 0.5, 0.75)
#: presses the same at every ratio (drawn as one point each), as kivi is
FROZEN = ("kivi2", "kivi4", "kivi8", "linformer", "simlayerkv")


def many_presses_run(tmp_path, presses: list[str]) -> TaskRun:
    """A finished task run of 4 tasks × 6 examples: each press scores its own way, except that every second press
    (from the third on) scores exactly as the one before it at every ratio and stores the same bytes, so its panel
    notes a pair drawn side by side; the presses of `FROZEN` score the same at every ratio."""
    rng = np.random.default_rng(len(presses))
    rows = []
    for task_index, task in enumerate(TASKS):
        for example in range(6):
            unit = {"example": task_index * 6 + example, "question": 0, "task": task, "length": 1024, "depth": 0.5,
                    "prediction": "x"}
            rows.append({**unit, "press": "full", "ratio": 0.0, "score": 1.0, "bytes_share": 1.0})
            previous: dict[float, float] = {}
            for index, press in enumerate(presses):
                twin = index >= 2 and index % 2 == 1 and press not in FROZEN and presses[index - 1] not in FROZEN
                frozen = float(rng.uniform() < 0.6)
                for ratio in RATIOS:
                    score = previous[ratio] if twin else frozen if press in FROZEN else float(rng.uniform() > ratio)
                    previous[ratio] = score
                    rows.append({**unit, "press": press, "ratio": ratio, "score": score,
                                 "bytes_share": 0.3 if press in FROZEN else 1 - ratio})
    examples = pd.DataFrame(rows)
    meta = {"kind": "evaluate", "model": {"name": "tiny"}, "data": {"name": "tasks.jsonl"}}
    return TaskRun(tmp_path, meta, examples, task_scores(examples, 0, replicates=20), pd.DataFrame(),
                   pd.DataFrame(), pd.DataFrame())


def drawn(run: TaskRun):
    """The figure, drawn and saved as the CLI does (PNG, tight), every matplotlib warning raised as an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = draw_scores(run)
        figure.savefig(io.BytesIO(), format="png", dpi=60, bbox_inches="tight")
    return figure


@pytest.mark.parametrize("count", [4, 9, 20, len(default_presses())])
def test_the_score_figure_stays_readable_with_every_press_of_the_default_list(tmp_path, count) -> None:
    presses = list(default_presses()[:count])
    figure = drawn(many_presses_run(tmp_path, presses))
    renderer = figure.canvas.get_renderer()
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert len(panels) == len(TASKS)
    dpi = figure.dpi
    for ax in panels:  # each axis keeps a readable size (it collapsed to a fifth of its panel)
        box = ax.get_window_extent(renderer)
        assert box.width / dpi >= 3.0 and box.height / dpi >= 2.4, (count, box.width / dpi, box.height / dpi)
    for one, other in combinations(panels, 2):  # a panel's title and tick labels never reach another
        assert not one.get_tightbbox(renderer).overlaps(other.get_tightbbox(renderer)), count
    assert all(ax.get_legend() is None for ax in panels), "one key for every panel"
    (key,) = figure.legends
    box = key.get_window_extent(renderer)
    for ax in panels:
        assert not box.overlaps(ax.get_tightbbox(renderer)), (count, ax.get_title())
    whole = figure.get_window_extent(renderer)
    assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1 and whole.y0 - 1 <= box.y0, "the key inside the figure"
    labels = [text.get_text() for text in key.get_texts()]
    assert labels[0] == "full cache"
    assert sorted(labels[1:]) == sorted(f"{press} (any ratio)" if press in FROZEN else press for press in presses)
    # every press once in the key, each with its own marker and a colour apart from every other and the full cache's
    lines = {press: by_gid(panels[0].lines, f"score:passkey:{press}") for press in presses}
    markers = [line.get_marker() for line in lines.values()]
    assert len(set(markers)) == len(markers), markers
    colours = {press: line.get_color() for press, line in lines.items()}
    colours["full"] = by_gid(panels[0].lines, "full:passkey").get_color()
    for (a, one), (b, other) in combinations(colours.items(), 2):
        distance = np.linalg.norm(cielab(one) - cielab(other))
        assert distance >= 25, (a, b, round(distance, 1))
    pyplot().close(figure)


def test_presses_drawn_side_by_side_are_named_in_the_key_per_task(tmp_path) -> None:
    """The notes of presses whose points are all the same (drawn `DODGE` apart) are the key's title, a line per
    set of tasks they hold in, wrapped to the figure's width; the full cache's score stands in each panel's title."""
    presses = list(default_presses()[:9])
    run = many_presses_run(tmp_path, presses)
    figure = drawn(run)
    (key,) = figure.legends
    title = key.get_title().get_text()
    pairs = [f"{presses[index - 1]} = {presses[index]}" for index in range(3, len(presses), 2)
             if presses[index] not in FROZEN]
    assert title.splitlines()[0] == "side by side, the same scores:"
    flat = " ".join(title.split())
    assert flat.endswith(f"every task: {'; '.join(pairs)}"), "groups the same in every task written once"
    longest = max(len(line) for line in title.splitlines())
    renderer = figure.canvas.get_renderer()
    assert key.get_window_extent(renderer).width <= figure.get_window_extent(renderer).width + 1, longest
    full = run.scores[run.scores["press"] == "full"].set_index("task")["score"]
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles == [f"{task} (6 examples; full cache {full[task]:.2f})" for task in TASKS]
    pyplot().close(figure)
