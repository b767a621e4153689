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
can be read cell by cell; `cache` draws `spectra cache --plot`'s NLL and kept-mass curves. The others are the
report pages' pictures (`spectra.pages`, drawn by the page: `spectra <page> RUN… --out DIR` writes the same picture
beside the page's markdown and table): `tasks` is the task-scores page's (a task run's score against the ratio
removed per held task and press), `leaderboard` the leaderboard's (task runs pooled, presses in rank order),
`survival` the survival page's (the needle kept per layer and key/value head by the best presses and SnapKV at
r = 0.5; `--ratio` draws another of the runs' ratios), `questions` the many-question page's (presses ranked on the
share of the full cache's answers each keeps). The README prints the command under each picture.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

import spectra
from spectra.pages import PAGES, Page
from spectra.report import summaries
from spectra.report.survival import SURVIVAL_RATIO
from spectra.report.plots.style import draw_heatmap, pyplot, subtitle

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


def page_picture(page: Page) -> Callable[..., Any]:
    """The picture of a report page (`spectra.pages`): the runs checked and pooled as the page does, then drawn;
    keywords are the page's options (the survival picture's `ratio`)."""

    def draw(runs: list, **options: Any):
        return page.draw(page.prepare(runs, page.options(**options)))

    draw.__doc__ = page.draw.__doc__
    return draw


#: the names the README's commands give the report pages' pictures where they differ from the page's (`spectra tasks`
#: writes task files, so the page is task-scores; the front page's command predates it)
NAMED = {"task-scores": "tasks"}
PICTURES = {"figure1": draw_figure1, "heatmap": draw_sink_heatmap, "cache": draw_cache,
            **{NAMED.get(name, name): page_picture(page) for name, page in PAGES.items()}}
#: the pictures that pool several runs
POOLING = ("figure1", *(NAMED.get(name, name) for name, page in PAGES.items() if page.pools))


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
        extra = {"ratio": args.ratio} if args.ratio is not None else {}
        size = save(PICTURES[args.picture](runs, **extra), args.out)
    except spectra.SpectraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({size // 1000} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
