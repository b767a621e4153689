"""Which presses answer as kvpress 0.5.5 does, cell for cell: the committed table of the comparisons, and the
leaderboard's column `= kvpress (cells)` read from it.

`benchmarks/kvpress_check.py --tasks F --spectra RUN/task_examples.csv --equality results/kvpress-equality.csv` runs
kvpress's own pipeline on a task file and compares its greedy answers with a spectra run's, answer for answer (after
strip(), as kvpress's scoring strips them: `cells`); `counted` sums them per press — spectra's name, as the board
names it —, loop (`question-free`: the question appended after compression, kvpress's leaderboard; `query-aware`: the
question compressed with the context), records asking one question or several, ratio and task file, and `record`
merges them into the table (a comparison repeated on the same file replaces its rows). A board's column says, per
press, the answers equal of those compared over every ratio and task file of its loop ("8/8", "0/4"), "—" for a press
kvpress lacks (its class declares no `peer`), "not compared" where no comparison holds it; `equal_everywhere` names the
presses whose every compared answer is equal, at every ratio compared: the only ones a page may call equal to kvpress.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from .. import registry
from ..errors import SpectraError
from ..registry import PRESSES

if TYPE_CHECKING:
    import pandas as pd

#: the table's columns, in order; a row is one (press, loop, questions, ratio, task file)
COLUMNS = ("press", "loop", "questions", "ratio", "data", "data_sha256", "compared", "equal", "kvpress")
KEY = ("press", "loop", "questions", "ratio", "data_sha256")
#: the loops kvpress's pipeline runs, by whether the question is compressed with the context
LOOPS = {False: "question-free", True: "query-aware"}
#: records asking one question, or several of one context (kvpress's `questions=[…]`)
ONE, SEVERAL = "one", "several"
#: where the committed table lies in the repository
TABLE = Path("results") / "kvpress-equality.csv"
#: the column's text for a press kvpress lacks, and for one no comparison holds
ABSENT, UNCOMPARED = "—", "not compared"


def cells(kvpress: pd.DataFrame, spectra: pd.DataFrame, query_aware: bool) -> pd.DataFrame:
    """kvpress's answers in the loop `query_aware` (press, ratio, query_aware, example, question, prediction, score)
    beside a spectra run's per-example table's on the same (press, ratio, example, question): `prediction_kvpress`,
    `prediction_spectra`, the scores alike, and `equal` (the predictions after strip())."""
    theirs = kvpress[kvpress["query_aware"] == query_aware]
    if "question" not in theirs:  # before records asked several questions
        theirs = theirs.assign(question=0)
    if "question" not in spectra:
        spectra = spectra.assign(question=0)
    merged = theirs.merge(spectra[["press", "ratio", "example", "question", "prediction", "score"]],
                          on=["press", "ratio", "example", "question"], suffixes=("_kvpress", "_spectra"))
    return merged.assign(equal=merged["prediction_kvpress"].astype(str).str.strip()
                         == merged["prediction_spectra"].astype(str).str.strip())


def counted(compared: pd.DataFrame, query_aware: bool, questions: str, data: Path, version: str) -> pd.DataFrame:
    """The table's rows of one comparison (`cells`) on the task file `data`: per press and ratio the answers compared
    and those equal, with the loop, whether records ask `questions` ONE or SEVERAL, the file's name and sha256 and
    kvpress's version."""
    import pandas as pd

    sha = hashlib.sha256(Path(data).read_bytes()).hexdigest()
    sums = compared.groupby(["press", "ratio"], sort=False)["equal"].agg(["size", "sum"]).reset_index()
    return pd.DataFrame({"press": sums["press"], "loop": LOOPS[bool(query_aware)], "questions": questions,
                         "ratio": sums["ratio"].astype(float), "data": Path(data).name, "data_sha256": sha,
                         "compared": sums["size"].astype(int), "equal": sums["sum"].astype(int), "kvpress": version},
                        columns=list(COLUMNS))


def read(path: str | Path) -> pd.DataFrame:
    """The committed table (empty where there is none yet: every press "not compared"); a damaged one is one line."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        return pd.DataFrame(columns=list(COLUMNS))
    try:
        table = pd.read_csv(path, dtype={"press": str, "data": str, "data_sha256": str, "kvpress": str},
                            keep_default_na=False)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise SpectraError(f"{path} is not readable ({str(error).splitlines()[0]}): write it again with "
                           "benchmarks/kvpress_check.py --equality") from None
    if tuple(table.columns) != COLUMNS:
        raise SpectraError(f"{path} has the columns {', '.join(table.columns)}, not {', '.join(COLUMNS)}: write it "
                           "again with benchmarks/kvpress_check.py --equality")
    return table


def record(path: str | Path, rows: pd.DataFrame) -> pd.DataFrame:
    """The table at `path` with `rows` merged in (a row of the same press, loop, questions, ratio and task file
    replaced), sorted, written whole; returns it."""
    import pandas as pd

    from ..rundir import write_table

    table = read(path)
    kept = table[~table.set_index(list(KEY)).index.isin(rows.set_index(list(KEY)).index)]
    merged = pd.concat([kept, rows], ignore_index=True).sort_values(list(KEY), kind="stable", ignore_index=True)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_table(Path(path), merged[list(COLUMNS)])
    return merged


def peer(press: str) -> str:
    """The kvpress class a press of the board equals at its defaults ("" for spectra's own; the full cache is
    kvpress's pipeline without a press): a press taking a path or a wrapper, as its own class declares it."""
    if press == "full":
        return "pipeline"
    parts = registry.applied(press)
    name = parts[0] if parts is not None and parts[0] in PRESSES.entries() else press
    try:
        return str(PRESSES.facts(name).get("peer") or "")
    except (KeyError, SpectraError):
        return ""


def mine(table: pd.DataFrame, query_aware: bool, questions: str) -> pd.DataFrame:
    """The rows of a board's loop and kind of records."""
    return table[(table["loop"] == LOOPS[bool(query_aware)]) & (table["questions"] == questions)]


def column(table: pd.DataFrame, presses: list[str], query_aware: bool, questions: str = ONE) -> dict[str, str]:
    """Per press of a board (the full cache `full`): its answers equal to kvpress's of those compared, "8/8", over
    every ratio and task file of the board's loop and kind of records; ABSENT for a press kvpress lacks, UNCOMPARED
    for one no comparison holds."""
    rows = mine(table, query_aware, questions).groupby("press")[["compared", "equal"]].sum()
    found = {}
    for press in presses:
        if not peer(press):
            found[press] = ABSENT
        elif press not in rows.index or rows.loc[press, "compared"] == 0:
            found[press] = UNCOMPARED
        else:
            found[press] = f"{int(rows.loc[press, 'equal'])}/{int(rows.loc[press, 'compared'])}"
    return found


def equal_everywhere(table: pd.DataFrame, presses: list[str], query_aware: bool, questions: str = ONE) -> list[str]:
    """The presses of `presses` (the full cache left out) compared in the board's loop whose every compared answer
    equals kvpress's, at every ratio compared: the only ones a page may call equal to kvpress."""
    rows = mine(table, query_aware, questions)
    return [press for press in presses if press != "full" and peer(press)
            and (rows["press"] == press).any()
            and (rows.loc[rows["press"] == press, "equal"] == rows.loc[rows["press"] == press, "compared"]).all()]
