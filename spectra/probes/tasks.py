"""The task protocol's probe: each example's exact prefill compressed by every (press, ratio), the answer decoded
greedily from each compressed cache, scored, and the needle's fate measured per layer and key/value head.

`prefilled` receives the example's prefill layer by layer (`tasks.examples.TaskSource.run`); `after_batch` compresses
every cell (`spectra.kv.cell`: the full cache, press 'full' at ratio 0, and every press at every ratio) in order of
ratio, and decodes them together: the cells' caches join a batch until the next would take it past `--decode-memory`
(`kv.batching`: buffers, padding and the rows a transform holds), then that batch is answered greedily as one
(`batching.greedy`: one forward pass per step for all its cells) and freed. A press that compresses while decoding
answers alone (`generation.greedy` with its recompression). Per cell and example it
keeps the answer's token ids and what the cell counted: the share of context rows kept (per layer and key/value head,
and their mean), the bytes of the compressed context cache beside the full one's, and per layer and key/value head the
share of the needle the press kept (NaN where the rows are not context positions); from the full cache's decoding,
the question's attention mass on the needle per layer and key/value head (the mean over the head's query heads).
Everything is numeric state, checkpointed after any example (`--resume`
goes on from the next example) and summed across processes; predictions are decoded and scored when the tables are
written. Seconds spent compressing and decoding per cell go to run.json (`press_seconds`), not to the tables, so a
resumed run's tables equal an uninterrupted run's bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..kv import batching, generation
from ..kv.cell import Cell, Cells
from ..kv.presses import Prefill
from ..kv.presses.decoding import INTERVAL
from ..stats import State, tagged
from ..kv.tasks import needle as needles
from ..kv.tasks.scoring import score
from ..kv.tasks.summary import task_scores
from .base import Probe

if TYPE_CHECKING:
    from ..reporter import Reporter
    from ..kv.tasks.examples import Example, TaskSource

#: bytes the caches decoded together may take by default (`--decode-memory`'s 2 GiB)
DECODE_MEMORY = 2 * 2**30
#: the per-example table's columns
EXAMPLE_COLUMNS = ("press", "ratio", "example", "task", "length", "depth", "prediction", "score", "kept",
                   "bytes", "bytes_share", "needle_kept")


@dataclass(frozen=True)
class Answering:
    """One example being answered: its position among the examples evaluated, the example, every layer's prefill,
    the question's ids, the needle's context positions and the room a cache keeps for the question and answer."""

    position: int
    example: Example
    prefills: list[Prefill]
    question: torch.Tensor
    needle: torch.Tensor
    room: int


class TaskProbe(Probe):
    """Every (press, ratio) of `presses` × `ratios` beside the full cache on the first `samples` examples of
    `source`; `seed` is the run's (bootstrap intervals draw from it)."""

    def __init__(self, source: TaskSource, presses: Sequence[str], ratios: Sequence[float], seed: int,
                 samples: int, compression_interval: int = INTERVAL, decode_memory: int = DECODE_MEMORY,
                 reporter: Reporter | None = None) -> None:
        self.source, self.seed, self.decode_memory, self.reporter = source, seed, decode_memory, reporter
        self.cells = Cells(presses, ratios, compression_interval=compression_interval, layers=source.layers)
        self.variants = self.cells.variants
        self.examples = source.examples[:samples]
        layers, kv_heads, cells = source.layers, source.kv_heads, len(self.variants)
        tokens = max(example.record.max_new_tokens for example in self.examples)
        self.ids = np.zeros((cells, samples, tokens), dtype=np.int64)  # token id + 1; 0: no token
        self.done = np.zeros(samples)
        self.kept = np.zeros((cells, samples))
        self.bytes = np.zeros((cells, samples, 2))  # the compressed context cache's bytes, the full one's
        self.survival = np.zeros((cells, samples, layers, kv_heads))
        self.head_kept = np.zeros((cells, samples, layers, kv_heads))  # share of context rows each head keeps
        self.mass = np.zeros((samples, layers, kv_heads))
        self.seconds = np.zeros((cells, 2))  # compressing, decoding
        self.prefills: dict[int, Prefill] = {}
        self.stop = generation.stop_tokens(source.loaded.model)

    def prefilled(self, prefill: Prefill) -> None:
        self.prefills[prefill.layer] = prefill

    def after_batch(self, batch: Any) -> None:
        """Every cell of the batch's example (see the module docstring)."""
        position = batch.index[0]
        example = self.examples[position]
        prefills = [self.prefills[layer] for layer in range(self.source.layers)]
        self.prefills = {}
        question = example.question_ids.to(self.source.device)
        at = Answering(position, example, prefills, question, torch.as_tensor(example.needle, device=question.device),
                       question.shape[-1] + example.record.max_new_tokens)
        cells: list[Cell | None] = list(self.cells.of(example.context, self.seed, example.record.example))
        first = prefills[0]
        row_bytes = batching.batch_row_bytes(first.kv_heads, first.head_dim, first.value.shape[-1],
                                             first.key.element_size())
        pending: list[int] = []
        pending_rows: list[list[int]] = []  # each pending cell's rows per layer
        held, groups, began = 0, 0, time.perf_counter()
        # by ratio (cells that keep as many rows share a group and pad nothing), the full cache first
        for i in sorted(range(len(cells)), key=lambda cell: (self.variants[cell][1], cell)):
            cell = cells[i]
            started = time.perf_counter()
            for prefill in prefills:
                cell.compress(prefill)
            self.seconds[i, 0] += time.perf_counter() - started
            if cell.decodes:  # its cache changes length mid-answer: it decodes on its own
                self.decode_alone(i, cells, at)
                continue
            rows, own = batching.cell_rows(cell.parts), batching.held_bytes(cell.parts)
            if pending and batching.group_bytes([*pending_rows, rows], at.room, row_bytes) + held + own > \
                    self.decode_memory:
                self.decode_group(pending, cells, at)
                pending, pending_rows, held, groups = [], [], 0, groups + 1
            pending.append(i)
            pending_rows.append(rows)
            held += own
        if pending:
            self.decode_group(pending, cells, at)
            groups += 1
        if self.reporter is not None and not self.done.any() and len(self.examples) > 1:  # an example's cost, once
            self.reporter.notify(f"each example: {len(cells)} cells, compressed and answered in {groups} "
                                 f"{'batch' if groups == 1 else 'batches'} ({time.perf_counter() - began:.1f} s "
                                 "after its prefill on the first)")
        self.done[position] = 1

    def decode_group(self, group: Sequence[int], cells: list[Cell | None], at: Answering) -> None:
        """The answers of the cells `group` (indices into `cells`), decoded as one batch (`kv.batching`); each
        cell's records taken and its cache freed."""
        started = time.perf_counter()
        batch = batching.Batch.of([cells[i].parts for i in group], at.prefills, at.room)
        full = [row for row, i in enumerate(group) if cells[i].compressor is None]
        answers = batching.greedy(self.source.loaded.model, self.source.layers, batch, at.question,
                                  [cells[i].start for i in group], at.example.record.max_new_tokens, self.stop,
                                  at.example.record.example, at.needle, full[0] if full else None)
        del batch
        for i, decoded in zip(group, answers):  # the group's decoding time, shared by its cells
            self.seconds[i, 1] += (time.perf_counter() - started) / len(group)
            self.record(i, cells, decoded, at)

    def decode_alone(self, i: int, cells: list[Cell | None], at: Answering) -> None:
        """The answer of cell `i`, whose press compresses while decoding, from its cache alone."""
        cell = cells[i]
        started = time.perf_counter()
        decoded = generation.greedy(self.source.loaded.model, self.source.layers, cell.buffers(at.prefills, at.room),
                                    at.question, cell.start, at.example.record.max_new_tokens, self.stop,
                                    at.example.record.example, None, cell.recompression())
        self.seconds[i, 1] += time.perf_counter() - started
        self.record(i, cells, decoded, at)

    def record(self, i: int, cells: list[Cell | None], decoded: generation.Decoded, at: Answering) -> None:
        """What cell `i` counted on the example and its answer, kept; the cell is then dropped (its cache freed)."""
        cell, position, context = cells[i], at.position, at.example.context
        self.ids[i, position, :len(decoded.ids)] = np.asarray(decoded.ids) + 1
        counts = cell.counts()  # (layers, H_kv); a cell that decodes: its target everywhere
        self.head_kept[i, position] = counts / context
        self.kept[i, position] = counts.mean() / context
        self.bytes[i, position] = [cell.bytes(), cell.full_bytes()]
        self.survival[i, position] = cell.survival(at.example.needle)
        if decoded.needle_mass is not None:
            per_head = decoded.needle_mass.double().cpu()  # (layers, H) → mean over each key/value group
            mass = per_head.unflatten(1, (self.source.kv_heads, -1)).mean(-1).numpy()
            self.mass[position] = mass if at.example.needle.size else np.nan
        cells[i] = None

    def state(self) -> State:
        return tagged({"tasks.ids": self.ids, "tasks.done": self.done, "tasks.kept": self.kept,
                       "tasks.bytes": self.bytes,
                       "tasks.survival": self.survival, "tasks.mass": self.mass, "tasks.seconds": self.seconds,
                       "tasks.head_kept": self.head_kept})

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.ids, self.done = np.array(arrays["tasks.ids"]), np.array(arrays["tasks.done"])
        self.kept, self.survival = np.array(arrays["tasks.kept"]), np.array(arrays["tasks.survival"])
        self.bytes = np.array(arrays["tasks.bytes"])
        self.mass, self.seconds = np.array(arrays["tasks.mass"]), np.array(arrays["tasks.seconds"])
        self.head_kept = np.array(arrays["tasks.head_kept"])

    def describe(self) -> dict[str, Any]:
        done = max(int(self.done.sum()), 1)
        seconds = [{"press": press, "ratio": ratio, "compress": self.seconds[i, 0] / done,
                    "decode": self.seconds[i, 1] / done} for i, (press, ratio) in enumerate(self.variants)]
        return {"examples": int(self.done.sum()), "press_seconds": seconds}

    def predictions(self) -> list[list[str]]:
        """[cell][position] the decoded answer (special tokens dropped, as kvpress's pipeline returns it)."""
        tokenizer = self.source.loaded.tokenizer
        return [[tokenizer.decode([int(token) - 1 for token in row if token], skip_special_tokens=True)
                 for row in cell] for cell in self.ids]

    def tables(self) -> dict[str, pd.DataFrame]:
        """task_examples.csv (per press, ratio and example), task_scores.csv (per press, ratio and task, beside the full
        cache, with bootstrap intervals), task_lengths.csv (the same per task and length), task_needle.csv (per press,
        ratio, layer and key/value head: the needle kept, over all examples and over the failed ones, the full
        cache's attention on it, and `kept`, the share of context rows the head kept: the achieved compression per
        head, which differs between heads for AdaKV and DuoAttention), task_evicted.csv (per failed example: the layers where no head kept the needle)."""
        done = np.flatnonzero(self.done)
        predictions = self.predictions()
        rows = []
        for cell, (press, ratio) in enumerate(self.variants):
            for position in done:
                example = self.examples[position]
                record = example.record
                rows.append({"press": press, "ratio": ratio, "example": record.example, "task": record.task,
                             "length": example.length, "depth": np.nan if record.depth is None else record.depth,
                             "prediction": predictions[cell][position],
                             "score": score(record.task, predictions[cell][position], record.answers),
                             "kept": self.kept[cell, position], "bytes": self.bytes[cell, position, 0],
                             "bytes_share": self.bytes[cell, position, 0] / max(self.bytes[cell, position, 1], 1),
                             "needle_kept": _nanmean(self.survival[cell, position])})
        examples = pd.DataFrame(rows, columns=list(EXAMPLE_COLUMNS))
        scores = examples.pivot_table(index="example", columns=["press", "ratio"], values="score", sort=False)
        return {"task_examples.csv": examples,
                "task_scores.csv": task_scores(examples, self.seed, ("task",)),
                "task_lengths.csv": task_scores(examples, self.seed, ("task", "length")),
                "task_needle.csv": self._needle_table(done, scores),
                "task_evicted.csv": self._evicted_table(done, examples)}

    def _failed(self, cell: int, done: np.ndarray, scores: pd.DataFrame) -> np.ndarray:
        """Positions among `done` where the cell scored below the full cache."""
        press, ratio = self.variants[cell]
        example_ids = [self.examples[position].record.example for position in done]
        mine = scores[(press, ratio)].reindex(example_ids).to_numpy()
        baseline = scores[("full", 0.0)].reindex(example_ids).to_numpy()
        return done[mine < baseline]

    def _needle_table(self, done: np.ndarray, scores: pd.DataFrame) -> pd.DataFrame:
        rows = []
        mass = _nanmean(self.mass[done], axis=0)
        for cell, (press, ratio) in enumerate(self.variants):
            failed = self._failed(cell, done, scores)
            kept = _nanmean(self.survival[cell, done], axis=0)
            kept_failed = _nanmean(self.survival[cell, failed], axis=0)
            head_kept = _nanmean(self.head_kept[cell, done], axis=0)
            for layer in range(self.source.layers):
                for head in range(self.source.kv_heads):
                    rows.append({"press": press, "ratio": ratio, "layer": layer, "head": head,
                                 "needle_kept": kept[layer, head], "needle_kept_failed": kept_failed[layer, head],
                                 "failed": len(failed), "needle_mass": mass[layer, head],
                                 "kept": head_kept[layer, head]})
        return pd.DataFrame(rows, columns=["press", "ratio", "layer", "head", "needle_kept", "needle_kept_failed",
                                           "failed", "needle_mass", "kept"])

    def _evicted_table(self, done: np.ndarray, examples: pd.DataFrame) -> pd.DataFrame:
        scores = examples.pivot_table(index="example", columns=["press", "ratio"], values="score", sort=False)
        rows = []
        for cell, (press, ratio) in enumerate(self.variants):
            for position in self._failed(cell, done, scores):
                record = self.examples[position].record
                lost = needles.evicted_layers(self.survival[cell, position])
                rows.append({"press": press, "ratio": ratio, "example": record.example, "task": record.task,
                             "length": self.examples[position].length,
                             "depth": np.nan if record.depth is None else record.depth,
                             "score": scores.loc[record.example, (press, ratio)],
                             "full": scores.loc[record.example, ("full", 0.0)], "evicted": len(lost),
                             "evicted_layers": ",".join(map(str, lost)), "first_evicted": lost[0] if lost else -1})
        return pd.DataFrame(rows, columns=["press", "ratio", "example", "task", "length", "depth", "score", "full",
                                           "evicted", "evicted_layers", "first_evicted"])

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """needle.npz: survival (cells, examples, layers, key/value heads), mass (examples, layers, key/value heads),
        the cells' presses and ratios and the examples' line indices; answers.npz: the answers' token ids (cells,
        examples, max_new_tokens; −1 after an answer's end), with the same presses, ratios and examples."""
        done = np.flatnonzero(self.done)
        cells = {"press": np.array([press for press, _ in self.variants]),
                 "ratio": np.array([ratio for _, ratio in self.variants]),
                 "example": np.array([self.examples[p].record.example for p in done], dtype=np.int64)}
        return {"needle.npz": {"survival": self.survival[:, done], "mass": self.mass[done], **cells},
                "answers.npz": {"ids": self.ids[:, done] - 1, **cells}}


def _nanmean(values: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """The mean over the defined values (NaN where none is), without numpy's empty-slice warning."""
    values = np.asarray(values, dtype=np.float64)
    count = np.isfinite(values).sum(axis=axis)
    total = np.where(np.isfinite(values), values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan) if axis is not None else (
            float(total / count) if count else float("nan"))
