"""The front page's pictures: one PNG per headline result, drawn from finished runs by the package's own figures,
at a resolution that keeps the repository light (100 dpi, no PDF; a picture over 200 KB is refused).

    python analyses/pictures.py figure1 RUN [RUN …] --out figures/figure1-minilm.png   # spectra figure1's layout
    python analyses/pictures.py heatmap RUN --out figures/heatmap-smollm2.png          # c at n/4 beside sink mass
    python analyses/pictures.py cache RUN --out figures/cache-smollm2.png              # spectra cache --plot's view
    python analyses/pictures.py tasks RUN --out figures/tasks-smollm2.png              # a task run's score curves
    python analyses/pictures.py leaderboard RUN [RUN …] --out figures/leaderboard.png  # task runs pooled, ranked
    python analyses/pictures.py survival RUN [RUN …] --out figures/survival.png        # the top presses' needle
    python analyses/pictures.py questions RUN [RUN …] --out figures/questions.png      # many questions, ranked

`figure1` draws `spectra figure1`'s curves and heatmap; `heatmap` draws, per layer and head of an analyze run,
c at index n/4 (how skewed P's spectrum is) beside the sink mass (the attention on the first token), so the two
can be read cell by cell; `cache` draws `spectra cache --plot`'s NLL and kept-mass curves; `tasks` draws a task run's
score against the ratio removed per task and press beside the full cache's line (`spectra cache --plot`'s
task_scores view), on the tasks whose full cache answers (`report.leaderboard.HOLDS`), naming those left out;
`leaderboard` pools task runs of one task file (`report.leaderboard`) and draws every press's score per ratio and
its mean, presses in rank order; `survival` draws, for the leaderboard's top three presses and SnapKV, the share of
the needle each layer and key/value head kept at r = 0.5 (half the cache; `--ratio` draws another of the runs'
ratios; the ratio stands in its title and colour bar), beside the full cache's attention on it (where a ranking comes
from); `questions` pools task runs of a many-question task file and ranks presses on the questions the full cache
answers (the share of its answers each keeps). The README prints the command under each picture.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import spectra
from spectra.report import summaries
from spectra.report.survival import SURVIVAL_RATIO
from spectra.report.plots.style import draw_heatmap, pyplot, subtitle, title_lines

#: the front page's resolution and the largest picture it takes
DPI, MOST_BYTES = 100, 200_000


def draw_figure1(runs: list):
    from spectra.report.plots.figure1 import draw_figure1

    return draw_figure1(runs)


def draw_sink_heatmap(runs: list):
    """c at index n/4 and the sink mass of one analyze run, per layer (down) and head (across), side by side."""
    from spectra.report.analyze import heatmap_size

    run = runs[0]
    if "sink_mean" not in run.metrics.columns:
        raise spectra.SpectraError(f"{run.path} has no sink mass (a run from before it was measured)")
    plt = pyplot()
    width, height = heatmap_size(run.layers, run.heads)
    figure, (left, right) = plt.subplots(1, 2, figsize=(2 * width, height + 0.3), layout="constrained")
    at = run.n // 4
    draw_heatmap(left, summaries.c_at(run, at), title=f"Normalized cumulative value at index {at}",
                 colorbar=f"c at index {at} (higher: lower rank)")
    draw_heatmap(right, summaries.metric_grid(run, "sink_mean"), title="Sink mass: attention to the first token",
                 colorbar="Share of a query's attention (mean)")
    figure.suptitle(subtitle(run, run.n))
    return figure


#: a press whose NLL rises more than this above the full cache's is drawn off the scale, so the others stay readable
OFF_SCALE = 3.0


def draw_cache(runs: list):
    """`spectra cache --plot`'s view; a press far worse than the rest (linformer's mixed rows, 10 nats above the
    others) would flatten every other line into the bottom of the NLL panel, so the panel stops above the others
    and says where that press went."""
    from spectra.report.cache import draw_cache

    figure = draw_cache(runs[0])
    nll = next(ax for ax in figure.axes if any(str(line.get_gid()).startswith("nll:") for line in ax.lines))
    full = next(line for line in nll.lines if line.get_gid() == "full").get_ydata()[0]
    lines = [line for line in nll.lines if str(line.get_gid()).startswith("nll:")]
    off = [line for line in lines if max(line.get_ydata()) > full + OFF_SCALE]
    if off and len(off) < len(lines):
        top = max(max(line.get_ydata()) for line in lines if line not in off)
        margin = 0.08 * (top - full)
        nll.set_ylim(full - margin, top + 2 * margin)
        table = runs[0].table
        for place, line in enumerate(off):  # its cells' NLL (a press the same at every ratio is one point, no full)
            low, high = table.loc[table["press"] == str(line.get_gid()).removeprefix("nll:"), "nll"].agg(["min", "max"])
            span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"
            nll.annotate(f"↑ {line.get_label()}: {span} nats, off the scale", xy=(0.5, 0.97 - 0.05 * place),
                         xycoords="axes fraction", ha="center", va="top", fontsize=8.5, color=line.get_color())
    return figure


def draw_tasks(runs: list):
    """A task run's score per press against the ratio removed, per task with the full cache's line; a task the full
    cache itself fails (mean score below HOLDS) says nothing about a press and is left out, named in the title."""
    import dataclasses

    from spectra.report.leaderboard import HOLDS
    from spectra.report.evaluate import TaskRun, draw_scores

    run = runs[0]
    if not isinstance(run, TaskRun):
        raise spectra.SpectraError(f"{run.path} is not a task run of spectra cache (a task file made by spectra tasks)")
    full = run.scores[run.scores["press"] == "full"].set_index("task")["score"]
    held = [task for task, score in full.items() if score >= HOLDS]
    if not held:
        raise spectra.SpectraError(f"{run.path}: the full cache answers no task (mean score ≥ {HOLDS:g})")
    figure = draw_scores(dataclasses.replace(run, scores=run.scores[run.scores["task"].isin(held)]))
    dropped = [f"{task} ({score:.2f})" for task, score in full.items() if task not in held]
    if dropped:  # under the title (below the panels stands the key)
        figure.suptitle(f"{figure.get_suptitle()}\n" + title_lines(
            f"left out, the full cache answering below {HOLDS:g}: {', '.join(dropped)}",
            int(figure.get_figwidth() / 0.09)))
    return figure


def task_runs_of(runs: list) -> list:
    """The runs, each a task run (one line otherwise)."""
    from spectra.report.evaluate import TaskRun

    for run in runs:
        if not isinstance(run, TaskRun):
            raise spectra.SpectraError(f"{run.path} is not a task run of spectra evaluate (a task file made by "
                                       "spectra tasks)")
    return runs


def draw_leaderboard(runs: list):
    """The pooled runs' presses ranked: score per ratio and the mean over ratios on the tasks the full cache holds."""
    from spectra.report import leaderboard
    from spectra.reporter import plural

    runs = task_runs_of(runs)
    examples = leaderboard.pooled(runs)
    seed = leaderboard.seed_of(runs)
    tasks, dropped = leaderboard.held(examples)
    order = leaderboard.ranking(examples, seed)
    full = examples[(examples["press"] == "full") & examples["task"].isin(tasks)]
    title = (f"{runs[0].meta['model']['name']}: mean score over {plural(full['example'].nunique(), 'example')} "
             f"of {plural(len(tasks), 'task')} the full cache answers ({', '.join(tasks)})")
    if dropped:
        title += "\nleft out, the full cache answering below " + f"{leaderboard.HOLDS:g}: " + ", ".join(
            f"{task} ({score:.2f})" for task, score in dropped.items())
    return leaderboard.draw(leaderboard.standings(examples, seed), order, title)


def draw_questions(runs: list):
    """The pooled runs of a many-question task file, presses ranked on the questions the full cache answers: the
    share of its answers each press keeps per ratio, and the mean over ratios."""
    from spectra.report import leaderboard
    from spectra.reporter import plural

    runs = task_runs_of(runs)
    examples = leaderboard.pooled(runs)
    seed = leaderboard.seed_of(runs)
    order = leaderboard.ranking(examples, seed, over="answered")
    full = examples[examples["press"] == "full"]
    answered = len(leaderboard.answered_rows(full))  # the full cache's answered questions
    title = (f"{runs[0].meta['model']['name']}: share kept of the {answered} answers the full cache gives to "
             f"{len(full)} questions\n({plural(full['example'].nunique(), 'record')}, each compressed once without "
             "its questions, then asked them one by one)")
    return leaderboard.draw(leaderboard.standings(examples, seed, over="answered"), order, title,
                            label="Share of the full cache's answers kept")


def draw_survival(runs: list, ratio: float | None = None):
    """The needle kept per layer and key/value head at `ratio` (default `survival.SURVIVAL_RATIO`, 0.5) by the
    leaderboard's best presses that evict tokens, and SnapKV (`survival.survivors`: where the ranking comes from),
    beside the full cache's attention on the needle."""
    import dataclasses

    from spectra.report import leaderboard, survival
    from spectra.report.evaluate import draw_survival as survival_picture

    runs = task_runs_of(runs)
    examples = leaderboard.pooled(runs)
    order = leaderboard.ranking(examples, leaderboard.seed_of(runs))
    needle = leaderboard.pooled_needle(runs)
    ratio = survival.SURVIVAL_RATIO if ratio is None else ratio
    measured = sorted(set(examples["ratio"]) - {0.0})
    if not any(abs(ratio - other) < 1e-9 for other in measured):
        raise spectra.SpectraError(f"--ratio {ratio:g}: the runs measured the ratios "
                                   f"{', '.join(f'{other:g}' for other in measured)}; give one of them")
    ratio = next(other for other in measured if abs(ratio - other) < 1e-9)
    chosen = survival.survivors(examples, order, needle, ratio)
    if not chosen:
        raise spectra.SpectraError(f"no press of the runs evicted tokens at ratio {ratio:g} and recorded where the "
                                   "needle went")
    needle = needle[needle["press"].isin(["full", *chosen])]
    needle = needle.assign(order=needle["press"].map({press: place for place, press in enumerate(["full", *chosen])}))
    needle = needle.sort_values("order", kind="stable").drop(columns="order")
    return survival_picture(dataclasses.replace(runs[0], needle=needle), ratio)


PICTURES = {"figure1": draw_figure1, "heatmap": draw_sink_heatmap, "cache": draw_cache, "tasks": draw_tasks,
            "leaderboard": draw_leaderboard, "questions": draw_questions, "survival": draw_survival}
#: the pictures that pool several runs
POOLING = ("figure1", "leaderboard", "questions", "survival")


def check_out(out: Path) -> None:
    """Refuse an --out the picture cannot be written to, before any run loads: not a PNG name, a directory, or
    under a file or a folder this user cannot write (`save` still turns a refused write into one line)."""
    if out.suffix.lower() != ".png":
        raise spectra.SpectraError(f"--out {out}: the front page's pictures are PNG files (name.png)")
    if out.is_dir():
        raise spectra.SpectraError(f"--out {out} is a directory; give the PNG's file name (name.png)")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise spectra.SpectraError(f"--out {out}: {folder} is a file, not a folder; give a path under a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise spectra.SpectraError(f"--out {out}: {folder} is not writable; give a path under a folder you can write")


def save(figure, out: Path) -> int:
    """Write `figure` as a PNG at DPI, whole or not at all (a file beside it, renamed over `out` once written; on a
    failed write nothing stays, not even the folders made for it); its size in bytes (a picture over MOST_BYTES is
    refused, and not written)."""
    plt = pyplot()
    made = [folder for folder in [out.parent, *out.parent.parents] if not folder.exists()]
    partial = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(partial, dpi=DPI, bbox_inches="tight", format="png")
        size = partial.stat().st_size
        if size > MOST_BYTES:
            raise spectra.SpectraError(f"{out} would be {size // 1000} KB, over the front page's "
                                       f"{MOST_BYTES // 1000} KB")
        os.replace(partial, out)
    except OSError as error:
        raise spectra.SpectraError(f"--out {out}: cannot write it ({error.strerror or error}); give a path under a "
                                   "folder you can write") from None
    finally:
        plt.close(figure)
        if partial.parent.is_dir():
            partial.unlink(missing_ok=True)
        for folder in made:  # the folders made for a picture that was not written, deepest first
            if not out.exists() and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("picture", choices=sorted(PICTURES))
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--ratio", type=float, default=None,
                        help="survival only: the ratio whose needle is drawn (default: "
                             f"{SURVIVAL_RATIO:g}, half the cache)")
    args = parser.parse_args(argv)
    try:
        check_out(args.out)
        if args.picture not in POOLING and len(args.runs) != 1:
            raise spectra.SpectraError(f"`{args.picture}` draws one run, got {len(args.runs)}")
        if args.ratio is not None and args.picture != "survival":
            raise spectra.SpectraError(f"--ratio belongs to the survival picture, not to `{args.picture}`")
        if args.ratio is not None and not 0 < args.ratio < 1:
            raise spectra.SpectraError(f"--ratio {args.ratio:g}: a ratio of the cache removed, between 0 and 1")
        runs = [spectra.load_run(path) for path in args.runs]
        extra = {"ratio": args.ratio} if args.picture == "survival" else {}
        size = save(PICTURES[args.picture](runs, **extra), args.out)
    except spectra.SpectraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({size // 1000} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
