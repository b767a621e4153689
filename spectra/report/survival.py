"""Where a leaderboard's ranking comes from: the needle each of its best presses kept, and where it lost it.

A retrieval task is answered from the needle's keys and values, so a press that fails where the full cache answers
has either evicted the needle somewhere the answer needed it, or kept it and failed for another reason (a lost
question key, a broken positional pattern). The task runs record both per example (`task_evicted.csv`: the layers
whose key/value heads all lost the whole needle; `task_examples.csv`: the share of the needle kept) and per layer
and head (`task_needle.csv`). `survivors` picks the presses worth reading — the best-ranked ones that evicted tokens
at a ratio, and SnapKV, the press every KV-cache paper compares against — and `survival` tells, per press, how
many of the full cache's answers it kept, how many of its failures had a layer lose the needle from every head,
which layer lost it first most often, and how much of the needle it kept where it answered and where it failed.
The picture of the same presses per layer and head is `report.evaluate.draw_survival`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from . import leaderboard

if TYPE_CHECKING:
    import pandas as pd

    from .evaluate import TaskRun

#: how many of the leaderboard's best presses are read, and at which ratio (kvpress's middle one)
SURVIVING, SURVIVAL_RATIO = 3, 0.5
#: the press every KV-cache paper compares against, read beside the best ones: spectra's name, then kvpress's
#: registry's (`kvpress:snapkv`, SnapKVPress() as kvpress's leaderboard runs it), whichever a board ran
REFERENCES = ("snapkv", "kvpress:snapkv")
REFERENCE = REFERENCES[0]


def reference_in(presses: Iterable[str]) -> str:
    """SnapKV's name among `presses` (the first of REFERENCES a board ran; REFERENCE where it ran none)."""
    present = set(presses)
    return next((name for name in REFERENCES if name in present), REFERENCE)


def survivors(examples: pd.DataFrame, order: pd.DataFrame, needle: pd.DataFrame, ratio: float = SURVIVAL_RATIO,
              top: int = SURVIVING, reference: str | None = None) -> list[str]:
    """The `top` best-ranked presses (`order`: `leaderboard.ranking`) that evicted tokens at `ratio` and recorded
    where the needle went there, then `reference` when it did too. A press that kept every token (kivi's bits,
    simlayerkv where it leaves every layer whole) keeps every needle and says nothing of where a ranking comes
    from; an unranked press (one that did not compress as far as r asks) is not among the best."""
    import pandas as pd

    reference = reference_in(order["press"]) if reference is None else reference
    at = examples[examples["ratio"] == ratio]
    evicting = set(at.loc[at["kept"] < 1, "press"])
    recorded = set(needle[(needle["ratio"] == ratio) & needle["needle_kept"].notna()]["press"]) & evicting
    ranked = [press for press, rank in zip(order["press"], order["rank"]) if press in recorded and not pd.isna(rank)]
    return list(dict.fromkeys([*ranked[:top], *([reference] if reference in recorded else [])]))


def pooled_evicted(runs: Sequence[TaskRun]) -> pd.DataFrame:
    """The runs' failure tables (task_evicted.csv: per press, ratio and failed example) as one (`leaderboard.pooled`
    checks the runs alike and their cells disjoint)."""
    import pandas as pd

    return pd.concat([run.evicted for run in runs], ignore_index=True)


def survival(examples: pd.DataFrame, evicted: pd.DataFrame, presses: Sequence[str], ratio: float = SURVIVAL_RATIO,
             holds: float = leaderboard.HOLDS) -> pd.DataFrame:
    """Per press of `presses` at `ratio`, over the held tasks' examples whose full cache answers (score 1):
    `answered` (how many), `kept` (how many of them the press answers too), `failed` (how many it scores below the
    full cache), `whole_layer` (of those failures, how many had a layer whose key/value heads all lost the whole
    needle), `first_layer` (the layer that most often lost it first in them; -1 where none did), `needle_answered`
    and `needle_failed` (the mean share of the needle's tokens the press kept where it answered, where it failed;
    NaN where there is none)."""
    import pandas as pd

    rows = leaderboard.answered_rows(leaderboard.held_rows(examples, holds))
    full = rows[rows["press"] == "full"].set_index(["example", "question"])["score"]
    lost = evicted.set_index(["press", "ratio", "example", "question"])
    table = []
    for press in presses:
        mine = rows[(rows["press"] == press) & (rows["ratio"] == ratio)].set_index(["example", "question"])
        failed = mine[mine["score"] < full.loc[mine.index]]
        whole = [lost.loc[(press, ratio, *key)] for key in failed.index if (press, ratio, *key) in lost.index]
        firsts = pd.Series([int(row["first_evicted"]) for row in whole if row["evicted"] > 0], dtype=int)
        table.append({"press": press, "answered": len(mine), "kept": int((mine["score"] >= 1).sum()),
                      "failed": len(failed), "whole_layer": len(firsts),
                      "first_layer": int(firsts.mode().min()) if len(firsts) else -1,
                      "needle_answered": float(mine.loc[mine["score"] >= 1, "needle_kept"].mean()),
                      "needle_failed": float(failed["needle_kept"].mean())})
    return pd.DataFrame(table, columns=["press", "answered", "kept", "failed", "whole_layer", "first_layer",
                                        "needle_answered", "needle_failed"])
