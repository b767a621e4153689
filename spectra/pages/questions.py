"""`spectra questions RUN… --out DIR`: many questions per context — presses ranked on the answers the full cache gives.

The runs of a many-question task file (each record compressed once without its questions, then asked them one by
one from that cache, as KVzip and SCBench do) pooled as the leaderboard pools them (`report.board`). No task holds as
a whole there, so presses are judged on the questions the full cache answers (`report.leaderboard.answered_rows`):
a cell is the share of those answers the press keeps, with tiers and rank intervals, and the ranking over every
question beside it. Claims: the full cache scores below `report.leaderboard.HOLDS` over every question (why the
answered ones are the scope); the first press loses some of them.
"""

from __future__ import annotations

from .base import PAGE, Sheet, register
from .leaderboard import BoardPage, Pooled


def questions_sheet(pooled: Pooled) -> Sheet:
    """The ranking on the answered questions with each cell's interval and the kvpress column, the ranking over every
    question, and the values the prose quotes (records, questions, answers, the full cache's score over all)."""
    from ..kv.tasks.summary import task_scores
    from ..report import equality, leaderboard
    from ..report.board import filter_table, kvpress_facts, leaders, ranking_table, tier_facts, unranked, widths
    from ..report.markdown import listed, with_interval

    board = pooled.board
    examples, full = board.examples, board.full
    cells, order, every = board.standings("answered"), board.ranking("answered"), board.ranking("all")
    raw = task_scores(full, board.seed, by=()).iloc[0]  # the full cache's score over every question, answered or not
    ranked, named = leaders(order)
    column, kvpress, agreed = kvpress_facts(board, order, equality.SEVERAL, pooled.equality)
    values = {**named, "model": board.runs[0].meta["model"]["name"], "length": str(int(examples["length"].max())),
              "records": str(full["example"].nunique()), "questions": str(len(full)),
              "tasks": listed([f"`{task}`" for task in dict.fromkeys(full["task"])]),
              "full": with_interval(raw["score"], raw["low"], raw["high"]),
              "answered": str(len(leaderboard.answered_rows(full))), "presses": str(len(ranked)),
              "unranked": unranked(examples, order), **tier_facts(order),
              "table": ranking_table(cells, order, kvpress=column), "widths": widths(cells),
              "holds": f"{leaderboard.HOLDS:g}", "all_table": filter_table(every),
              "all_first": leaders(every)[1]["first"], **kvpress}
    return Sheet(values, {"full-below-holds": bool(raw["score"] < leaderboard.HOLDS),
                          "first-loses-some": bool(ranked["score"].iloc[0] < 1.0), **agreed})


class QuestionsPage(BoardPage):
    name = "questions"
    summary = "Many questions per context: presses ranked on the share of the full cache's answers each keeps."
    order = 20
    over = "answered"
    runs_help = ("Run directories of spectra evaluate on one many-question task file (or their published folders).")
    text = """Model {model}, tasks {tasks} at {length} tokens: questions {questions} of records {records}, over which the
full cache scores {full}. Presses are judged on the questions it answers ({answered}), each record compressed once and
asked its questions one by one: a cell is the share of those answers the press keeps. Presses ranked by their mean
over the ratios: {presses}, in tiers: {tiers}; listed without a rank: {unranked}. {first} keeps the most,
{first_score}; SnapKV ranks {reference_rank}. The compressed cells' intervals are {widths} wide.

{table}

## Over every question

{all_table}"""

    def sheet(self, prepared: Pooled, view: str = PAGE) -> Sheet:
        return questions_sheet(prepared)

    def draw(self, prepared: Pooled):
        """The presses ranked on the questions the full cache answers: the share of its answers each keeps per ratio,
        and the mean over ratios."""
        from ..report import leaderboard
        from ..reporter import plural

        board = prepared.board
        full = board.full
        answered = len(leaderboard.answered_rows(full))
        title = (f"{board.runs[0].meta['model']['name']}: share kept of the {answered} answers the full cache gives "
                 f"to {len(full)} questions\n({plural(full['example'].nunique(), 'record')}, each compressed once "
                 "without its questions, then asked them one by one)")
        return leaderboard.draw(board.standings("answered"), board.ranking("answered"), title,
                                label="Share of the full cache's answers kept")


register(QuestionsPage())
