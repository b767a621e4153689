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
    figure = pictures.PICTURES["tasks"]([run])
    drawn = {line.get_gid() for ax in figure.axes for line in ax.lines if line.get_gid()}
    assert drawn == {"score:passkey:knorm", "full:passkey"}
    title = " ".join(figure.get_suptitle().split())  # the key stands below the panels: the note is in the title
    assert title.endswith("(95% bootstrap intervals) left out, the full cache answering below 0.8: vt (0.00)")
    failed = dataclasses.replace(run, scores=run.scores[run.scores["task"] == "vt"])
    with pytest.raises(spectra.SpectraError, match="answers no task"):
        pictures.PICTURES["tasks"]([failed])


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
    figure = pictures.PICTURES["leaderboard"](leaderboard_runs())
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["full", "1. knorm", "2. streaming"]
    title = " ".join(figure.get_suptitle().split())  # the figure's title, wrapped to its width
    assert "4 examples of 1 task the full cache answers (passkey)" in title
    assert "left out, the full cache answering below 0.8: vt (0.00)" in title
    figure = pictures.PICTURES["survival"](leaderboard_runs())
    assert [ax.get_gid() for ax in figure.axes if ax.get_gid()] == ["mass", "kept:knorm", "kept:streaming"]
    quantized = leaderboard_runs()  # knorm keeping every token (as kivi does): no eviction to show
    first = quantized[0]
    quantized[0] = dataclasses.replace(first, examples=first.examples.assign(
        kept=first.examples["kept"].where(first.examples["press"] != "knorm", 1.0)))
    figure = pictures.PICTURES["survival"](quantized)
    assert [ax.get_gid() for ax in figure.axes if ax.get_gid()] == ["mass", "kept:streaming"]


def test_many_questions_rank_presses_on_the_answers_the_full_cache_gives() -> None:
    """The same runs read as many-question runs: judged on the 4 passkey questions the full cache answers (vt's are
    left out question by question), knorm keeping 3 of 4 answers, streaming 1."""
    figure = pictures.PICTURES["questions"](leaderboard_runs())
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["full", "1. knorm", "2. streaming"]
    title = " ".join(figure.get_suptitle().split())
    assert "share kept of the 4 answers the full cache gives to 8 questions" in title
    written = [text.get_text() for text in ax.texts]
    assert written[:3] == ["1.00", "1.00", "1.00"] and written[3:6] == ["0.75", "0.75", "0.75"]


def test_the_leaderboard_draws_task_runs_only(analyzed, tmp_path, capsys) -> None:
    assert pictures.main(["leaderboard", str(analyzed.path), "--out", str(tmp_path / "x.png")]) == 2
    assert "is not a task run" in capsys.readouterr().err


def test_pooling_runs_of_other_examples_or_ratios_says_what_differs_naming_the_directories(tmp_path, capsys,
                                                                                           monkeypatch) -> None:
    """Issue 55: `pictures.py leaderboard A B` on runs of different examples blamed the decoding ("another spectra
    version or --dtype?") and named both runs 'm · t.jsonl'; runs of different ratios pooled silently, exit 0."""
    knorm, streaming = leaderboard_runs()
    fewer = dataclasses.replace(streaming, examples=streaming.examples[streaming.examples["example"] < 6])
    one_ratio = dataclasses.replace(streaming, examples=streaming.examples[streaming.examples["ratio"] != 0.75])
    for second, message in ((fewer, "runs/b lacks examples 6–7 that runs/a has: "),
                            (one_ratio, "runs/b ran streaming at ratios 0.5 and runs/a ran knorm at ratios 0.5, 0.75")):
        found = {"runs/a": knorm, "runs/b": second}
        monkeypatch.setattr(spectra, "load_run", lambda path: dataclasses.replace(found[str(path)], path=path))
        out = tmp_path / "board.png"
        assert pictures.main(["leaderboard", "runs/a", "runs/b", "--out", str(out)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"error: {message}") and error.count("\n") == 1 and "decode" not in error
        assert not out.exists()


def test_an_out_that_cannot_be_written_is_one_line_and_nothing_written(analyzed, tmp_path, capsys,
                                                                       monkeypatch) -> None:
    """Issue 55, item 7: `--out /proc/x.png` was a traceback (FileNotFoundError from savefig). A folder that refuses
    the file, a file where a folder should be and a write that fails half-way are one line, exit 2, and leave
    nothing behind — neither a partial PNG nor the folders made for it."""
    import matplotlib.figure

    def refused(arguments: list[str], message: str) -> None:
        assert pictures.main(arguments) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err

    if Path("/proc").is_dir():  # a folder nobody can create files in, not even root
        refused(["heatmap", str(analyzed.path), "--out", "/proc/x.png"], "--out /proc/x.png: cannot write it")
        assert not Path("/proc/x.png").exists()
    (tmp_path / "file").write_text("")
    refused(["heatmap", str(analyzed.path), "--out", str(tmp_path / "file" / "sub" / "x.png")],
            f"{tmp_path / 'file'} is a file, not a folder")
    (tmp_path / "folder.png").mkdir()
    refused(["heatmap", str(analyzed.path), "--out", str(tmp_path / "folder.png")], "is a directory")

    def full_disk(figure, path, **options) -> None:  # writes half a PNG, then the disk is full
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    refused(["heatmap", str(analyzed.path), "--out", str(tmp_path / "new" / "deeper" / "x.png")],
            "cannot write it (No space left on device)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file", "folder.png"], "nothing left behind"


def test_the_survival_picture_says_its_ratio_and_draws_another_on_request(tmp_path, capsys, monkeypatch) -> None:
    """Issue 55, item 7: the survival picture was drawn at r = 0.5 only, the command not saying so. r = 0.5 stays the
    default, `--ratio` draws another of the runs' ratios, the ratio is in the title and the kept share's colour bar,
    and a ratio the runs did not measure (or --ratio given to another picture) is one line."""
    figure = pictures.PICTURES["survival"](leaderboard_runs())
    assert figure.get_suptitle().endswith("at ratio 0.5")
    labels = [ax.get_ylabel() for ax in figure.axes]
    assert "Share of the needle kept at r = 0.5 (0 to 1)" in labels
    figure = pictures.PICTURES["survival"](leaderboard_runs(), ratio=0.75)
    assert figure.get_suptitle().endswith("at ratio 0.75")
    assert "Share of the needle kept at r = 0.75 (0 to 1)" in [ax.get_ylabel() for ax in figure.axes]
    runs = {Path(run.path).name: run for run in leaderboard_runs()}
    monkeypatch.setattr(pictures.spectra, "load_run", lambda path: runs[Path(path).name])
    out = tmp_path / "survival.png"
    assert pictures.main(["survival", "knorm", "streaming", "--out", str(out), "--ratio", "0.75"]) == 0
    assert out.exists() and not [path for path in tmp_path.iterdir() if path.name.endswith(".partial")]
    for arguments, message in ((["survival", "knorm", "--ratio", "0.6"], "--ratio 0.6: the runs measured the "
                                "ratios 0.5, 0.75; give one of them"),
                               (["leaderboard", "knorm", "--ratio", "0.5"], "--ratio belongs to the survival picture"),
                               (["survival", "knorm", "--ratio", "1.5"], "between 0 and 1")):
        assert pictures.main([*arguments, "--out", str(tmp_path / "other.png")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "other.png").exists()
