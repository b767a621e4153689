"""analyses/pictures.py: the front page's pictures are PNG files at 100 dpi drawn from finished runs, under the size
limit, and bad input is one line with exit code 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import spectra

from .conftest import load


pictures = load("pictures")
QUIET = {"progress": None, "notify": lambda line: None}


@pytest.fixture(scope="module")
def analyzed(llama_dir, text_file, tmp_path_factory):
    return spectra.analyze(str(llama_dir), str(text_file), length=32, samples=2,
                           out=tmp_path_factory.mktemp("pictures") / "a", **QUIET)


def pixels(path: Path) -> tuple[int, int]:
    from matplotlib.image import imread

    height, width = imread(path).shape[:2]
    return width, height


@pytest.mark.parametrize("picture", ["figure1", "heatmap"])
def test_a_picture_of_an_analyze_run(analyzed, tmp_path, capsys, picture) -> None:
    out = tmp_path / "figures" / f"{picture}.png"
    assert pictures.main([picture, str(analyzed.path), "--out", str(out)]) == 0
    assert sorted(path.name for path in out.parent.iterdir()) == [f"{picture}.png"], "a PNG only, no PDF"
    assert 0 < out.stat().st_size <= pictures.MOST_BYTES
    width, height = pixels(out)
    figure = pictures.PICTURES[picture]([analyzed])
    inches = figure.get_size_inches()
    for got, size in ((width, inches[0]), (height, inches[1])):  # 100 dpi, give or take the tight crop
        assert 0.6 * size * pictures.DPI <= got <= 1.2 * size * pictures.DPI
    assert f"wrote {out}" in capsys.readouterr().out


def test_the_heatmap_shows_c_beside_the_sink_mass(analyzed) -> None:
    figure = pictures.draw_sink_heatmap([analyzed])
    titles = [ax.get_title() for ax in figure.axes if ax.get_gid() == "heatmap"]
    assert titles == [f"Normalized cumulative value at index {analyzed.n // 4}",
                      "Sink mass: attention to the first token"]


def test_a_picture_of_a_cache_run(llama_dir, text_file, tmp_path) -> None:
    run = spectra.cache(str(llama_dir), str(text_file), context=70, continuation=6, samples=1,
                        presses="streaming,knorm", ratios="0.25,0.5", out=tmp_path / "c", **QUIET)
    out = tmp_path / "cache.png"
    assert pictures.main(["cache", str(run.path), "--out", str(out)]) == 0
    assert out.stat().st_size <= pictures.MOST_BYTES
    figure = pictures.draw_cache([run])
    assert not any(text.get_text().startswith("↑") for ax in figure.axes for text in ax.texts)
    table = run.table.copy()
    table.loc[table["press"] == "knorm", "nll"] += pictures.OFF_SCALE + 7  # far above the others, as linformer is
    figure = pictures.draw_cache([dataclasses.replace(run, table=table)])
    panel = next(ax for ax in figure.axes if any(line.get_gid() == "nll:knorm" for line in ax.lines))
    streaming = next(line for line in panel.lines if line.get_gid() == "nll:streaming").get_ydata()
    assert max(streaming) < panel.get_ylim()[1] < min(table[table["press"] == "knorm"]["nll"])
    low, high = table[table["press"] == "knorm"]["nll"].agg(["min", "max"])
    span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"
    assert [text.get_text() for text in panel.texts] == [f"↑ knorm: {span} nats, off the scale"]


@pytest.mark.parametrize("arguments, message", [
    (["heatmap", "RUN", "--out", "x.pdf"], "the front page's pictures are PNG files"),
    (["heatmap", "RUN", "RUN", "--out", "x.png"], "`heatmap` draws one run, got 2"),
    (["cache", "nowhere", "--out", "x.png"], "nowhere"),
])
def test_bad_input_is_one_line_and_exit_code_2(analyzed, tmp_path, capsys, arguments, message) -> None:
    arguments = [str(analyzed.path) if argument == "RUN" else argument for argument in arguments]
    arguments[arguments.index("--out") + 1] = str(tmp_path / arguments[arguments.index("--out") + 1])
    assert pictures.main(arguments) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not any(tmp_path.iterdir())


def test_a_picture_over_the_limit_is_refused(analyzed, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(pictures, "MOST_BYTES", 1000)
    out = tmp_path / "big.png"
    assert pictures.main(["figure1", str(analyzed.path), "--out", str(out)]) == 2
    assert "over the front page's 1 KB" in capsys.readouterr().err and not out.exists()


def test_a_picture_of_a_task_run_leaves_out_tasks_the_full_cache_fails() -> None:
    """Score curves of the tasks the full cache answers (≥ HOLDS), the others named under the title."""
    import pandas as pd

    from spectra.report.evaluate import TaskRun
    from spectra.kv.tasks.summary import task_scores

    rows = [{"press": press, "ratio": ratio, "example": example, "task": task, "length": 1024, "depth": 0.5,
             "score": float(task == "passkey" and (press == "full" or example % 2 == 0)), "needle_kept": 1.0}
            for example, task in enumerate(["passkey"] * 4 + ["vt"] * 4)
            for press, ratio in (("full", 0.0), ("knorm", 0.5), ("knorm", 0.75))]
    examples = pd.DataFrame(rows)
    run = TaskRun(Path("tasks"), {"model": {"name": "m"}, "data": {"name": "t.jsonl"}}, examples,
                  task_scores(examples, 0, replicates=100), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    figure = pictures.draw_tasks([run])
    drawn = {line.get_gid() for ax in figure.axes for line in ax.lines if line.get_gid()}
    assert drawn == {"score:passkey:knorm", "full:passkey"}
    title = " ".join(figure.get_suptitle().split())  # the key stands below the panels: the note is in the title
    assert title.endswith("(95% bootstrap intervals) left out, the full cache answering below 0.8: vt (0.00)")
    failed = dataclasses.replace(run, scores=run.scores[run.scores["task"] == "vt"])
    with pytest.raises(spectra.SpectraError, match="answers no task"):
        pictures.draw_tasks([failed])


def leaderboard_runs() -> list:
    """Two task runs of one task file (knorm in one, streaming in the other) on 4 passkey and 4 vt examples, the
    full cache answering every passkey and no vt; per layer (2) and key/value head (2) the needle kept."""
    import pandas as pd

    from spectra.report.evaluate import TaskRun

    runs = []
    for press, kept in (("knorm", 0.75), ("streaming", 0.25)):
        rows = [{"press": name, "ratio": ratio, "example": example, "question": 0, "task": task,
                 "prediction": "7" if name == "full" else "x",
                 "score": float(task == "passkey" and (name == "full" or example % 4 < 4 * kept)), "bytes_share": 1 - ratio,
                 "kept": 1 - ratio}
                for example, task in enumerate(["passkey"] * 4 + ["vt"] * 4)
                for name, ratio in (("full", 0.0), (press, 0.5), (press, 0.75))]
        needle = pd.DataFrame([{"press": name, "ratio": ratio, "layer": layer, "head": head,
                                "needle_kept": 1.0 if name == "full" else kept, "needle_mass": 0.1}
                               for name, ratio in (("full", 0.0), (press, 0.5), (press, 0.75))
                               for layer in range(2) for head in range(2)])
        meta = {"model": {"name": "m"}, "data": {"name": "t.jsonl", "sha256": "s"}, "settings": {"seed": 0}}
        runs.append(TaskRun(Path(press), meta, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), needle,
                            pd.DataFrame()))
    return runs


def test_the_leaderboard_ranks_the_pooled_runs_presses_on_the_tasks_the_full_cache_answers() -> None:
    figure = pictures.draw_leaderboard(leaderboard_runs())
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["full", "1. knorm", "2. streaming"]
    title = " ".join(figure.get_suptitle().split())  # the figure's title, wrapped to its width
    assert "4 examples of 1 task the full cache answers (passkey)" in title
    assert "left out, the full cache answering below 0.8: vt (0.00)" in title
    figure = pictures.draw_survival(leaderboard_runs())
    assert [ax.get_gid() for ax in figure.axes if ax.get_gid()] == ["mass", "kept:knorm", "kept:streaming"]
    quantized = leaderboard_runs()  # knorm keeping every token (as kivi does): no eviction to show
    first = quantized[0]
    quantized[0] = dataclasses.replace(first, examples=first.examples.assign(
        kept=first.examples["kept"].where(first.examples["press"] != "knorm", 1.0)))
    figure = pictures.draw_survival(quantized)
    assert [ax.get_gid() for ax in figure.axes if ax.get_gid()] == ["mass", "kept:streaming"]


def test_many_questions_rank_presses_on_the_answers_the_full_cache_gives() -> None:
    """The same runs read as many-question runs: judged on the 4 passkey questions the full cache answers (vt's are
    left out question by question), knorm keeping 3 of 4 answers, streaming 1."""
    figure = pictures.draw_questions(leaderboard_runs())
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["full", "1. knorm", "2. streaming"]
    title = " ".join(figure.get_suptitle().split())
    assert "share kept of the 4 answers the full cache gives to 8 questions" in title
    written = [text.get_text() for text in ax.texts]
    assert written[:3] == ["1.00", "1.00", "1.00"] and written[3:6] == ["0.75", "0.75", "0.75"]


def test_the_leaderboard_draws_task_runs_only(analyzed, tmp_path, capsys) -> None:
    assert pictures.main(["leaderboard", str(analyzed.path), "--out", str(tmp_path / "x.png")]) == 2
    assert "is not a task run" in capsys.readouterr().err
