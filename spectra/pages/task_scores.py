"""`spectra task-scores RUN --out DIR`: one task run's scores per press and ratio, on the tasks its full cache answers.

A task whose baseline fails (the model cannot answer it even with its whole cache) says nothing about a press, so
the page quotes a press's mean score only over the tasks whose full cache answers at least
`report.leaderboard.HOLDS` of the examples (`held`), and names those left out. Claims: a press holds at half the cache
(within 0.1 of the full cache, alone at the top); the presses spread wide there (more than 0.5 between the best and
the worst). The picture: each held task's score against the ratio removed, a line per press beside the full cache's
(`report.evaluate.draw_scores`). Named task-scores, not tasks: `spectra tasks` writes task files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import SpectraError
from .base import PAGE, Page, Sheet, register

if TYPE_CHECKING:
    import pandas as pd

    from ..report.evaluate import TaskRun

#: the ratio at which the presses are compared
HALF = 0.5


def full_scores(run: TaskRun, by: tuple[str, ...] = ("task",)) -> pd.Series:
    """The full cache's mean score per task (or per task and length), from the per-example table."""
    examples = run.examples[run.examples["press"] == "full"]
    return examples.groupby(list(by), sort=False)["score"].mean()


def held(run: TaskRun) -> list[str]:
    """The tasks of a run whose full-cache baseline holds (mean score ≥ HOLDS), in the run's order."""
    from ..report import leaderboard

    return leaderboard.held(run.examples)[0]


def press_scores(run: TaskRun, tasks: list[str]) -> pd.Series:
    """Mean score per (press, ratio) over the examples of `tasks` (the full cache as ('full', 0.0))."""
    examples = run.examples[run.examples["task"].isin(tasks)]
    return examples.groupby(["press", "ratio"], sort=False)["score"].mean()


def compressing(run: TaskRun) -> list[str]:
    """The presses a task run compressed with, in its order."""
    return [press for press in dict.fromkeys(run.examples["press"]) if press != "full"]


def ratios_of(run: TaskRun) -> list[float]:
    return sorted(set(run.examples["ratio"]) - {0.0})


def scores_sheet(run: TaskRun) -> Sheet:
    """Per press and ratio the mean score on the held tasks beside the full cache's, and which press keeps most and
    which least at half the cache."""
    import pandas as pd

    from ..report.leaderboard import HOLDS
    from ..report.markdown import listed, table, two

    tasks = held(run)
    scores = press_scores(run, tasks)
    ratios, presses = ratios_of(run), compressing(run)
    rows = [["full (r = 0)", two(scores[("full", 0.0)]), *[""] * (len(ratios) - 1)]]
    rows += [[f"`{press}`", *(two(scores[(press, ratio)]) for ratio in ratios)] for press in presses]
    half = pd.Series({press: scores[(press, HALF)] for press in presses})
    dropped = [task for task in full_scores(run).index if task not in tasks]
    examples = run.examples[run.examples["press"] == "full"].groupby("task").size()
    best, worst, full = half.idxmax(), half.idxmin(), float(scores[("full", 0.0)])
    values = {"examples": str(int(examples.min())), "length": str(int(run.examples["length"].max())),
              "held": listed([f"`{task}`" for task in tasks]), "holds": f"{HOLDS:g}",
              "dropped": listed([f"`{task}` ({two(full_scores(run)[task])})" for task in dropped]) or "none",
              "full_score": two(full), "half": f"{HALF:g}", "table": table(["press", *(f"r = {r:g}" for r in ratios)],
                                                                           rows),
              "best": f"`{best}`", "best_score": two(half[best]), "worst": f"`{worst}`",
              "worst_score": two(half[worst])}
    claims = {"a-press-holds-at-half": bool(half[best] >= full - 0.1 and (half == half[best]).sum() == 1),
              "presses-spread-wide": bool(half[best] - half[worst] > 0.5)}
    return Sheet(values, claims)


class TaskScoresPage(Page):
    name = "task-scores"
    summary = "One task run's mean score per press and ratio, on the tasks its full cache answers."
    order = 40
    pools = False
    commands = ("cache",)
    paragraphs = {"front-tasks": PAGE}
    runs_help = "A run directory of spectra evaluate (or spectra cache on a task file), or its published folder."
    text = """On {held}, the tasks whose full cache answers at least {holds} of their {examples} examples at {length}
tokens (left out: {dropped}), the full cache scores {full_score}. At r = {half}, {best} keeps the most
({best_score}) and {worst} the least ({worst_score}).

{table}"""

    def prepare(self, runs: list[Any], options: Any) -> TaskRun:
        from ..report.evaluate import TaskRun
        from ..report.leaderboard import HOLDS

        self.check_count(runs)
        run = runs[0]
        if not isinstance(run, TaskRun):
            raise SpectraError(f"{run.path} is not a task run (spectra evaluate, or spectra cache on a task file made "
                               "by spectra tasks)")
        if not held(run):
            raise SpectraError(f"{run.path}: the full cache answers no task of the run (≥ {HOLDS:g}): nothing to "
                               "compare presses on")
        if HALF not in ratios_of(run):
            raise SpectraError(f"{run.path} ran the ratios {', '.join(f'{ratio:g}' for ratio in ratios_of(run))}: "
                               f"the page compares presses at {HALF:g}; run that ratio too")
        return run

    def sheet(self, prepared: TaskRun, view: str = PAGE) -> Sheet:
        return scores_sheet(prepared)

    def draw(self, prepared: TaskRun):
        """Each held task's score per press against the ratio removed, with the full cache's line; the tasks left
        out named under the title."""
        import dataclasses

        from ..report.evaluate import draw_scores
        from ..report.leaderboard import HOLDS
        from ..report.plots.style import title_lines

        run = prepared
        full = run.scores[run.scores["press"] == "full"].set_index("task")["score"]
        tasks = [task for task, score in full.items() if score >= HOLDS]  # as the run's score table has them
        if not tasks:
            raise SpectraError(f"{run.path}: the full cache answers no task (mean score ≥ {HOLDS:g})")
        figure = draw_scores(dataclasses.replace(run, scores=run.scores[run.scores["task"].isin(tasks)]))
        dropped = [f"{task} ({score:.2f})" for task, score in full.items() if task not in tasks]
        if dropped:  # under the title (below the panels stands the key)
            figure.suptitle(f"{figure.get_suptitle()}\n" + title_lines(
                f"left out, the full cache answering below {HOLDS:g}: {', '.join(dropped)}",
                int(figure.get_figwidth() / 0.09)))
        return figure

    def table(self, prepared: TaskRun):
        """Per press and ratio (the full cache first) the mean score over the held tasks' examples."""
        scores = press_scores(prepared, held(prepared))
        return scores.rename("score").reset_index().assign(tasks=",".join(held(prepared)))


register(TaskScoresPage())
