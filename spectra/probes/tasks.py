"""The task protocol's probe: each example's exact prefill compressed by every (press, ratio), the answer decoded
greedily from each compressed cache, scored, and the needle's fate measured per layer and key/value head.

`prefilled` receives the prefills of a batch's examples (`--batch-size` of them, one after the other) layer by layer
(`tasks.examples.TaskSource.run`); `after_batch` compresses every cell of each (`spectra.kv.cell`: the full cache, press
'full' at ratio 0, and every press at every ratio), examples of fewer max_new_tokens first, then the widest
(`kv.pending.order`; on one example, by ratio), and decodes them together: the cells' caches join a batch within
`--decode-memory` (`kv.pending.Groups`), then that batch is answered greedily as one (`batching.greedy_batch`: one
forward pass per step for all its cells, each row stopping at its own example's max_new_tokens, or with
`--stop-answered` once its score is final) and freed. A press that compresses while decoding answers alone
(`generation.greedy_alone` with its recompression). A record asking several questions is answered from the same
compressed caches: each (question, cell) pair is a row of the group's batch, each row seeing its cell's context rows and
its own question and answer only — as kvpress's pipeline answers question after question, each question's tokens removed
before the next; its answers, needles and the full cache's attention on them are kept per (example, question): an
*item*. Per cell and example it keeps the answer's token ids and what the cell counted: the share of context rows kept
(per layer and key/value head, and their mean), the bytes of the compressed context cache beside the full one's, and per
layer and key/value head the share of the needle the press kept (NaN where the rows are not context positions); from the
full cache's decoding, the question's attention mass on the needle per layer and key/value head (the mean over the
head's query heads). Everything is numeric state, whole after any batch (`--resume`, with any batch size, goes on from
the first example not done) and summed across processes; predictions are decoded and scored when the tables are written.
Seconds spent compressing and decoding per cell go to run.json (`press_seconds`: a group's decoding time shared by its
cells, per example), not to the tables, so a resumed run's tables equal an uninterrupted run's bit for bit (at the
same batch size; another changes them only by the rounding of differently shaped sums).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from .. import sliding
from ..config import LocalLayers
from ..kv import batching, generation, pending, selfcheck
from ..kv.cell import Cell, Cells
from ..kv.generation import Request
from ..kv.presses import Prefill
from ..kv.presses.decoding import INTERVAL
from ..stats import State, tagged
from ..kv.tasks import needle as needles
from ..kv.tasks.scoring import score, settled
from ..kv.tasks.summary import task_scores
from .base import Probe

if TYPE_CHECKING:
    from ..reporter import Reporter
    from ..kv.tasks.examples import Example, TaskSource

#: bytes the caches decoded together may take by default (`--decode-memory`'s 2 GiB)
DECODE_MEMORY = 2 * 2**30
#: the per-example table's columns (one row per press, ratio, example and question)
EXAMPLE_COLUMNS = ("press", "ratio", "example", "question", "task", "length", "depth", "prediction", "score", "kept",
                   "bytes", "bytes_share", "needle_kept")


@dataclass(frozen=True)
class Asked:
    """One question of an example: its row in the probe's per-question state (`item`), its ids and its needle's
    context positions."""

    item: int
    ids: torch.Tensor
    needle: torch.Tensor


@dataclass(frozen=True)
class Answering:
    """One example being answered: its position among the examples evaluated, the example, every layer's prefill,
    its questions (one, or a many-question record's, each answered from the same compressed cache), the tokens of
    the longest and its cells (each dropped, None, once recorded)."""

    position: int
    example: Example
    prefills: list[Prefill]
    questions: list[Asked]
    longest: int
    cells: list[Cell | None]

    @property
    def room(self) -> int:
        """The columns a cache keeps for the longest question and its answer."""
        return self.longest + self.example.record.max_new_tokens


class TaskProbe(Probe):
    """Every (press, ratio) of `presses` × `ratios` beside the full cache on every example of `source` (the records
    the run evaluates), doing `local_layers` to a local layer (`kv.locallayers`); `seed`: the run's (its bootstrap);
    `stop_answered`: each answer ends once its score is final (`scoring.settled`)."""

    def __init__(self, source: TaskSource, presses: Sequence[str], ratios: Sequence[float], seed: int,
                 compression_interval: int = INTERVAL, decode_memory: int = DECODE_MEMORY,
                 reporter: Reporter | None = None, local_layers: LocalLayers = LocalLayers.KEEP,
                 stop_answered: bool = False) -> None:
        self.source, self.seed, self.decode_memory, self.reporter = source, seed, decode_memory, reporter
        self.stop_answered = stop_answered
        self.cells = Cells(presses, ratios, local_layers, compression_interval=compression_interval,
                           layers=source.layers, windows=sliding.of_model(source.loaded.model))
        self.variants = self.cells.variants
        self.examples = list(source.examples)
        # one item per (example, question): a single-question example has one, a many-question record one a question
        self.items = [(position, asked.index) for position, example in enumerate(self.examples)
                      for asked in example.asked]
        self.first_item = np.cumsum([0] + [len(example.asked) for example in self.examples])
        layers, kv_heads, cells, items = source.layers, source.kv_heads, len(self.variants), len(self.items)
        examples = len(self.examples)
        tokens = max(example.record.max_new_tokens for example in self.examples)
        self.ids = np.zeros((cells, items, tokens), dtype=np.int64)  # token id + 1; 0: no token
        self.done = np.zeros(examples)
        self.kept = np.zeros((cells, examples))
        self.bytes = np.zeros((cells, examples, 2))  # the compressed context cache's bytes, the full one's
        self.survival = np.zeros((cells, items, layers, kv_heads))  # each question's needle
        self.head_kept = np.zeros((cells, examples, layers, kv_heads))  # share of context rows each head keeps
        self.mass = np.zeros((items, layers, kv_heads))
        self.seconds = np.zeros((cells, 2))  # compressing, decoding
        self.prefills: list[list[Prefill]] = []  # per example of the batch, every layer's prefill so far
        self.stop = generation.stop_tokens(source.loaded.model)
        self.checked = False  # whether this process compared the full cache with model.generate yet

    def prefilled(self, prefill: Prefill) -> None:
        """A layer of the next example's prefill (layer 0 begins an example: the source prefills a batch's examples
        one after the other, in order)."""
        if prefill.layer == 0:
            self.prefills.append([])
        self.prefills[-1].append(prefill)

    def after_batch(self, batch: Any) -> None:
        """Every cell of the batch's examples (see the module docstring)."""
        if len(self.prefills) != len(batch.index):
            raise ValueError(f"{len(self.prefills)} examples prefilled for a batch of {len(batch.index)}")
        answering = [self.answering(position, prefills) for position, prefills in zip(batch.index, self.prefills)]
        self.prefills = []
        if not self.checked:  # before any press runs: the full cache answers as model.generate (`kv.selfcheck`)
            at = answering[0]
            request = Request(at.questions[0].ids, at.example.context, at.example.record.max_new_tokens, self.stop,
                              at.example.record.example)
            selfcheck.first_example(self.source.loaded.model, self.source.layers, at.prefills,
                                    at.example.context_ids.to(self.source.device), request)
            self.checked = True
        first = answering[0].prefills[0]
        groups = pending.Groups(self.decode_memory, batching.batch_row_bytes(
            first.kv_heads, first.head_dim, first.value.shape[-1], first.key.element_size()))
        decoded, began = 0, time.perf_counter()
        ratios = [ratio for _, ratio in self.variants]
        for owner, i in pending.order([at.example.context for at in answering], ratios,
                                      [at.example.record.max_new_tokens for at in answering]):
            at = answering[owner]
            cell = at.cells[i]
            started = time.perf_counter()
            for prefill in at.prefills:
                cell.compress(prefill)
            self.seconds[i, 0] += time.perf_counter() - started
            if cell.decodes:  # its cache changes length mid-answer: it decodes on its own
                self.decode_alone(i, at)
                continue
            full = groups.add(pending.Waiting(owner, i, batching.cell_rows(cell.parts),
                                              batching.held_bytes(cell.parts), len(at.questions), at.longest,
                                              at.example.record.max_new_tokens))
            if full:
                self.decode_group(full, answering)
                decoded += 1
        last = groups.rest()
        if last:
            self.decode_group(last, answering)
            decoded += 1
        if self.reporter is not None and not self.done.any() and len(self.examples) > 1:  # a batch's cost, once
            self.reporter.notify(pending.cost(len(answering), len(self.variants), decoded,
                                              time.perf_counter() - began))
        for at in answering:
            self.done[at.position] = 1

    def answering(self, position: int, prefills: list[Prefill]) -> Answering:
        """The example at `position`, prefilled (`prefills`, every layer's), ready to be compressed and answered."""
        example = self.examples[position]
        device = self.source.device
        questions = [Asked(int(self.first_item[position]) + j, asked.ids.to(device),
                           torch.as_tensor(asked.needle, device=device)) for j, asked in enumerate(example.asked)]
        return Answering(position, example, prefills, questions, max(asked.ids.shape[-1] for asked in questions),
                         list(self.cells.of(example.context, self.seed, example.record.example)))

    def decode_group(self, group: Sequence[pending.Waiting], answering: Sequence[Answering]) -> None:
        """The answers of the cells `group` (of the examples `answering`) to every question of their examples,
        decoded as one batch (`kv.batching`) whose rows are the (question, cell) pairs, each stopping at its own
        example's max_new_tokens: each question answered from the cell's compressed cache alone, its tokens and
        answer never seen by another question (kvpress's pipeline removes them); each cell's records taken and its
        cache freed."""
        started = time.perf_counter()
        owners = dict.fromkeys(waiting.owner for waiting in group)  # example by example, each question by question
        pairs = [(answering[owner], asked, waiting.cell) for owner in owners for asked in answering[owner].questions
                 for waiting in group if waiting.owner == owner]
        batch = batching.CacheBatch.of([at.cells[i].parts for at, _, i in pairs], [at.prefills for at, _, _ in pairs],
                                  pending.room(group))
        requests = [Request(asked.ids, at.cells[i].start, at.example.record.max_new_tokens, self.stop,
                            at.example.record.example, asked.needle if at.cells[i].compressor is None else None,
                            self.settling(asked.item)) for at, asked, i in pairs]
        answers = batching.greedy_batch(self.source.loaded.model, self.source.layers, batch, requests)
        del batch
        for (at, asked, i), decoded in zip(pairs, answers):
            self.answered(i, at, decoded, asked)
        share = (time.perf_counter() - started) / len(group)  # the group's decoding time, shared by its cells
        for waiting in group:
            self.seconds[waiting.cell, 1] += share
            self.record(waiting.cell, answering[waiting.owner])

    def decode_alone(self, i: int, at: Answering) -> None:
        """The answer of cell `i`, whose press compresses while decoding, from its cache alone (a fresh one for
        each question; the kind refuses such a press on a many-question record, as kvpress does)."""
        cell = at.cells[i]
        started = time.perf_counter()
        for asked in at.questions:
            request = Request(asked.ids, cell.start, at.example.record.max_new_tokens, self.stop,
                              at.example.record.example, settled=self.settling(asked.item))
            decoded = generation.greedy_alone(self.source.loaded.model, self.source.layers,
                                              cell.buffers(at.prefills, at.room), request, cell.recompression())
            self.answered(i, at, decoded, asked)
        self.seconds[i, 1] += time.perf_counter() - started
        self.record(i, at)

    def answered(self, i: int, at: Answering, decoded: generation.Decoded, asked: Asked) -> None:
        """Cell `i`'s answer to one question, kept, with the share of that question's needle it kept and (from the
        full cache's decoding) the question's attention on it."""
        self.ids[i, asked.item, :len(decoded.ids)] = np.asarray(decoded.ids) + 1
        needle = asked.needle.cpu().numpy()
        self.survival[i, asked.item] = at.cells[i].survival(needle)
        if decoded.needle_mass is not None:
            per_head = decoded.needle_mass.double().cpu()  # (layers, H) → mean over each key/value group
            mass = per_head.unflatten(1, (self.source.kv_heads, -1)).mean(-1).numpy()
            self.mass[asked.item] = mass if needle.size else np.nan

    def record(self, i: int, at: Answering) -> None:
        """What cell `i` counted on the example, kept; the cell is then dropped (its cache freed)."""
        cell, position, context = at.cells[i], at.position, at.example.context
        counts = cell.counts()  # (layers, H_kv); a cell that decodes: its target everywhere
        self.head_kept[i, position] = counts / context
        self.kept[i, position] = counts.mean() / context
        self.bytes[i, position] = [cell.bytes(), cell.full_bytes()]
        at.cells[i] = None

    def state(self) -> State:
        return tagged({"tasks.ids": self.ids, "tasks.done": self.done, "tasks.kept": self.kept,
                       "tasks.bytes": self.bytes, "tasks.survival": self.survival, "tasks.mass": self.mass,
                       "tasks.seconds": self.seconds, "tasks.head_kept": self.head_kept})

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.ids, self.done = np.array(arrays["tasks.ids"]), np.array(arrays["tasks.done"])
        self.kept, self.survival = np.array(arrays["tasks.kept"]), np.array(arrays["tasks.survival"])
        self.bytes = np.array(arrays["tasks.bytes"])
        self.mass, self.seconds = np.array(arrays["tasks.mass"]), np.array(arrays["tasks.seconds"])
        self.head_kept = np.array(arrays["tasks.head_kept"])

    def describe(self) -> dict[str, Any]:
        """run.json's `examples`: the records evaluated, as the tables count them (a many-question record compressed
        once per question under --query-aware is one example, whatever its compressions); `press_seconds` per
        compression."""
        done = max(int(self.done.sum()), 1)
        seconds = [{"press": press, "ratio": ratio, "compress": self.seconds[i, 0] / done,
                    "decode": self.seconds[i, 1] / done} for i, (press, ratio) in enumerate(self.variants)]
        records = {self.examples[position].record.example for position in np.flatnonzero(self.done)}
        return {"examples": len(records), "press_seconds": seconds}

    def predictions(self) -> list[list[str]]:
        """[cell][item] the decoded answer (special tokens dropped, as kvpress's pipeline returns it)."""
        tokenizer = self.source.loaded.tokenizer
        return [[tokenizer.decode([int(token) - 1 for token in row if token], skip_special_tokens=True)
                 for row in cell] for cell in self.ids]

    def tables(self) -> dict[str, pd.DataFrame]:
        """task_examples.csv (per press, ratio, example and question), task_scores.csv (per press, ratio and task,
        beside the full cache, with bootstrap intervals; a many-question record's score is the mean over its
        questions), task_lengths.csv (the same per task and length), task_needle.csv (per press, ratio, layer and
        key/value head: the needle kept, over all questions and over the failed ones, the full cache's attention on
        it, and `kept`, the share of context rows the head kept: the achieved compression per head, which differs
        between heads for AdaKV and DuoAttention), task_evicted.csv (per failed question: the layers where no head
        kept its needle); and where a record asks several questions, task_questions.csv (per press, ratio, task and
        question index, over the records that ask it)."""
        done = self.done_items()
        predictions = self.predictions()
        rows = []
        for cell, (press, ratio) in enumerate(self.variants):
            for item in done:
                position, question = self.items[item]
                example = self.examples[position]
                record = example.record
                rows.append({"press": press, "ratio": ratio, "example": record.example, "question": question,
                             "task": record.task, "length": example.length,
                             "depth": np.nan if record.depth is None else record.depth,
                             "prediction": predictions[cell][item],
                             "score": score(record.task, predictions[cell][item], self.answers(item)),
                             "kept": self.kept[cell, position], "bytes": self.bytes[cell, position, 0],
                             "bytes_share": self.bytes[cell, position, 0] / max(self.bytes[cell, position, 1], 1),
                             "needle_kept": _nanmean(self.survival[cell, item])})
        examples = pd.DataFrame(rows, columns=list(EXAMPLE_COLUMNS))
        records = per_record(examples)
        tables = {"task_examples.csv": examples, "task_scores.csv": task_scores(records, self.seed, ("task",)),
                  "task_lengths.csv": task_scores(records, self.seed, ("task", "length")),
                  "task_needle.csv": self._needle_table(done, examples),
                  "task_evicted.csv": self._evicted_table(done, examples)}
        if any(question for _, question in self.items):  # a record asks several questions
            tables["task_questions.csv"] = task_scores(examples, self.seed, ("task", "question"))
        return tables

    def done_items(self) -> np.ndarray:
        """The items (example, question) of the examples done, in order."""
        return np.array([item for item, (position, _) in enumerate(self.items) if self.done[position]], dtype=np.int64)

    def settling(self, item: int) -> Callable[[Sequence[int]], bool] | None:
        """With `stop_answered`, whether an answer to the item's question is final (decoded as `predictions`)."""
        if not self.stop_answered:
            return None
        task, answers = self.examples[self.items[item][0]].record.task, self.answers(item)
        return lambda ids: settled(task, self.source.loaded.tokenizer.decode(ids, skip_special_tokens=True), answers)

    def answers(self, item: int) -> tuple[str, ...]:
        """The accepted answers of an item's question."""
        position, question = self.items[item]
        return next(asked.answers for asked in self.examples[position].record.asked if asked.index == question)

    def _failed(self, cell: int, done: np.ndarray, examples: pd.DataFrame) -> np.ndarray:
        """Items among `done` where the cell scored below the full cache on the same question."""
        press, ratio = self.variants[cell]
        scores = examples.set_index(["press", "ratio", "example", "question"])["score"]
        keys = [(self.examples[self.items[item][0]].record.example, self.items[item][1]) for item in done]
        mine = np.array([scores[(press, ratio, *key)] for key in keys])
        baseline = np.array([scores[("full", 0.0, *key)] for key in keys])
        return done[mine < baseline] if len(done) else done

    def _needle_table(self, done: np.ndarray, examples: pd.DataFrame) -> pd.DataFrame:
        rows = []
        mass = _nanmean(self.mass[done], axis=0)
        positions = np.flatnonzero(self.done)
        for cell, (press, ratio) in enumerate(self.variants):
            failed = self._failed(cell, done, examples)
            kept = _nanmean(self.survival[cell, done], axis=0)
            kept_failed = _nanmean(self.survival[cell, failed], axis=0)
            head_kept = _nanmean(self.head_kept[cell, positions], axis=0)
            for layer in range(self.source.layers):
                for head in range(self.source.kv_heads):
                    rows.append({"press": press, "ratio": ratio, "layer": layer, "head": head,
                                 "needle_kept": kept[layer, head], "needle_kept_failed": kept_failed[layer, head],
                                 "failed": len(failed), "needle_mass": mass[layer, head],
                                 "kept": head_kept[layer, head]})
        return pd.DataFrame(rows, columns=["press", "ratio", "layer", "head", "needle_kept", "needle_kept_failed",
                                           "failed", "needle_mass", "kept"])

    def _evicted_table(self, done: np.ndarray, examples: pd.DataFrame) -> pd.DataFrame:
        scores = examples.set_index(["press", "ratio", "example", "question"])["score"]
        rows = []
        for cell, (press, ratio) in enumerate(self.variants):
            for item in self._failed(cell, done, examples):
                position, question = self.items[item]
                record = self.examples[position].record
                lost = needles.evicted_layers(self.survival[cell, item])
                rows.append({"press": press, "ratio": ratio, "example": record.example, "question": question,
                             "task": record.task, "length": self.examples[position].length,
                             "depth": np.nan if record.depth is None else record.depth,
                             "score": scores[(press, ratio, record.example, question)],
                             "full": scores[("full", 0.0, record.example, question)], "evicted": len(lost),
                             "evicted_layers": ",".join(map(str, lost)), "first_evicted": lost[0] if lost else -1})
        return pd.DataFrame(rows, columns=["press", "ratio", "example", "question", "task", "length", "depth",
                                           "score", "full", "evicted", "evicted_layers", "first_evicted"])

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """needle.npz: survival (cells, questions asked, layers, key/value heads), mass (questions asked, layers,
        key/value heads), the cells' presses and ratios and each question's example (line index) and question (its
        index within the record); answers.npz: the answers' token ids (cells, questions asked, max_new_tokens; −1
        after an answer's end), with the same presses, ratios, examples and questions."""
        done = self.done_items()
        cells = {"press": np.array([press for press, _ in self.variants]),
                 "ratio": np.array([ratio for _, ratio in self.variants]),
                 "example": np.array([self.examples[self.items[item][0]].record.example for item in done],
                                     dtype=np.int64),
                 "question": np.array([self.items[item][1] for item in done], dtype=np.int64)}
        return {"needle.npz": {"survival": self.survival[:, done], "mass": self.mass[done], **cells},
                "answers.npz": {"ids": self.ids[:, done] - 1, **cells}}


def per_record(examples: pd.DataFrame) -> pd.DataFrame:
    """The per-example table with one row per (press, ratio, example): a many-question record's score and needle
    kept averaged over its questions (a record asking one question keeps its row as it is)."""
    keys = ["press", "ratio", "example"]
    if not examples.duplicated(keys).any():
        return examples
    firsts = examples.drop_duplicates(keys).set_index(keys)
    means = examples.groupby(keys, sort=False)[["score", "needle_kept"]].mean()
    firsts[["score", "needle_kept"]] = means.reindex(firsts.index)
    return firsts.reset_index().drop(columns=["question", "prediction"])


def _nanmean(values: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """The mean over the defined values (NaN where none is), without numpy's empty-slice warning."""
    values = np.asarray(values, dtype=np.float64)
    count = np.isfinite(values).sum(axis=axis)
    total = np.where(np.isfinite(values), values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan) if axis is not None else (
            float(total / count) if count else float("nan"))
