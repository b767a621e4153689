"""`spectra survival RUN… --out DIR`: where a leaderboard's ranking comes from — the needle its best presses kept.

The runs of one task file pooled as the leaderboard pools them (`report.board`); at one ratio (`--ratio`, default
`report.survival.SURVIVAL_RATIO`, half the cache) the best presses that evict tokens and SnapKV
(`report.survival.survivors`), each read on the examples the full cache answers (`report.survival.survival`): the
answers it kept, its failures with a layer whose key/value heads all lost the whole needle and the layer that lost it
first most often, and the share of the needle kept where it answered and where it failed. Claims: every best press
read answers keeping only part of the needle (< `PART` of its tokens over layers and heads); SnapKV keeps answers
only where the needle lies near the end of the context (depth ≥ `LATE`), within reach of the window it scores by.
The picture: the needle kept per layer and key/value head beside the full cache's attention on it
(`report.evaluate.draw_survival`). The leaderboard's page quotes these values in its own
(`pages.leaderboard`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import SpectraError
from ..options import option
from .base import PAGE, Page, Sheet, register

if TYPE_CHECKING:
    from ..report.board import Board

#: a needle "near the end" of the context lies at least this deep (0 first token, 1 last): in reach of a window
LATE = 0.9
#: a press keeps "part" of the needle where it answers when its mean share of the needle's tokens is below this
PART = 0.9


@dataclass(frozen=True)
class SurvivalOptions:
    ratio: float | None = option(None, "The ratio whose needle is read, one the runs measured (default 0.5, half the "
                                       "cache).")


@dataclass
class Read:
    """A board and the ratio read, and the presses chosen there (`report.survival.survivors`)."""

    board: Board
    ratio: float
    chosen: list[str]


def read_at(board: Board, ratio: float | None) -> Read:
    """The presses worth reading at `ratio` (default SURVIVAL_RATIO), one of the runs' ratios (one line
    otherwise); none that evicted tokens there is one line too."""
    from ..report import leaderboard, survival

    ratio = survival.SURVIVAL_RATIO if ratio is None else ratio
    if not 0 < ratio < 1:
        raise SpectraError(f"--ratio {ratio:g}: a ratio of the cache removed, between 0 and 1")
    measured = sorted(set(board.examples["ratio"]) - {0.0})
    if not any(abs(ratio - other) < 1e-9 for other in measured):
        raise SpectraError(f"--ratio {ratio:g}: the runs measured the ratios "
                           f"{', '.join(f'{other:g}' for other in measured)}; give one of them")
    ratio = next(other for other in measured if abs(ratio - other) < 1e-9)
    chosen = survival.survivors(board.examples, board.ranking(), leaderboard.pooled_needle(board.runs), ratio)
    if not chosen:
        raise SpectraError(f"no press of the runs evicted tokens at ratio {ratio:g} and recorded where the needle "
                           "went: nothing to say where the ranking comes from")
    return Read(board, ratio, chosen)


def survival_table(read: Read):
    """`report.survival.survival` of the chosen presses at the ratio read."""
    from ..report import survival

    return survival.survival(read.board.examples, survival.pooled_evicted(read.board.runs), read.chosen, read.ratio)


def survival_sheet(read: Read) -> Sheet:
    """Per press read, its rank, the answers it kept, its failures with a layer that lost the needle, that layer and
    the needle kept where it answered and failed; the shallowest needle among SnapKV's kept answers; the claims."""
    from ..report import leaderboard
    from ..report.survival import reference_in
    from ..report.markdown import rank_text, share, table

    board, examples = read.board, read.board.examples
    found = survival_table(read)
    ranks = board.ranking().set_index("press")["rank"]
    reference = reference_in(ranks.index)
    rows = [[rank_text(ranks[row.press]), f"`{row.press}`", f"{row.kept} of {row.answered}",
             f"{row.whole_layer} of {row.failed}", "—" if row.first_layer < 0 else str(row.first_layer),
             f"{share(row.needle_answered)} / {share(row.needle_failed)}"]
            for row in found.itertuples()]
    best = found[(found["press"] != reference) & (found["kept"] > 0)]
    answered = leaderboard.answered_rows(leaderboard.held_rows(examples, leaderboard.HOLDS))  # as the table reads them
    kept = answered[(answered["press"] == reference) & (answered["ratio"] == read.ratio) & (answered["score"] >= 1)]
    shallowest = float(kept["depth"].min()) if len(kept) and "depth" in kept else float("nan")
    values = {"survival_ratio": f"{read.ratio:g}", "survival_presses": str(len(read.chosen)),
              "survival_table": table(["rank", "press", "answers kept", "failures with a layer that lost the needle",
                                       "that layer, most often", "needle kept: answered / failed"], rows),
              "reference_depth": share(shallowest), "reference_kept": str(len(kept))}
    claims = {"leaders-keep-part": bool(len(best) and (best["needle_answered"] < PART).all()),
              "reference-answers-late": bool(shallowest >= LATE)}
    return Sheet(values, claims)


class SurvivalPage(Page):
    name = "survival"
    summary = "Where a leaderboard's ranking comes from: the needle its best presses kept, per layer and head."
    order = 30
    options = SurvivalOptions
    text = """At r = {survival_ratio}, the {survival_presses} presses read are the best that evict tokens, and SnapKV,
each read on the examples the full cache answers.

{survival_table}

SnapKV kept {reference_kept} answers, the shallowest needle among them at depth {reference_depth}."""

    def prepare(self, runs: list[Any], options: SurvivalOptions) -> Read:
        from ..report.board import pooled_board

        return read_at(pooled_board(runs), options.ratio)

    def sheet(self, prepared: Read, view: str = PAGE) -> Sheet:
        return survival_sheet(prepared)

    def draw(self, prepared: Read):
        """The needle kept per layer and key/value head at the ratio read by the presses read, beside the full
        cache's attention on the needle."""
        import dataclasses

        from ..report import leaderboard
        from ..report.evaluate import draw_survival

        chosen = ["full", *prepared.chosen]
        needle = leaderboard.pooled_needle(prepared.board.runs)
        needle = needle[needle["press"].isin(chosen)]
        needle = needle.assign(order=needle["press"].map({press: place for place, press in enumerate(chosen)}))
        needle = needle.sort_values("order", kind="stable").drop(columns="order")
        return draw_survival(dataclasses.replace(prepared.board.runs[0], needle=needle), prepared.ratio)

    def table(self, prepared: Read):
        return survival_table(prepared).assign(ratio=prepared.ratio)


register(SurvivalPage())
