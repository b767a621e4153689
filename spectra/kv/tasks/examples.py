"""The task protocol's source for the loop: task records read through a decoder, `--batch-size` examples per batch.

Examples have their own lengths, so each is prefilled on its own; a batch's examples have their cells decoded
together by the probe (the loop checkpoints and resumes by batch, counting examples, and shards by example).
Opening reads the records (bad records are refused before any model loads); `start` reads the model's tokenizer,
builds every example's prompt as kvpress's pipeline does (`prompt.chat_prompt`: the chat-templated context, the
question with the template's suffix and the answer prefix; `query_aware`: the question joins the context and the
question part is the suffix and the answer prefix only, kvpress's evaluation convention) with its needle
(`needle.needle_tokens`), refuses a question longer than a press reading it can take (finch's window) before the
weights load, then loads them and refuses an example that does not fit the model's positions. `run` is the example's
one exact prefill (`spectra.kv.prefill`), every layer's `presses.Prefill` handed to the probe
(`spectra.probes.tasks`), which compresses, decodes and scores.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ... import checkpoints, data, distributed, models
from .. import batching, passes, prefill, reconstruction
from ...config import RunConfig
from ...errors import SpectraError, spell
from ..presses import Prefill
from ..presses.base import WINDOW
from ..presses.window import windowed_presses
from ...registry import PRESSES
from ...sources import OfLoadedModel
from .needle import needle_tokens
from .prompt import chat_prompt
from .records import TaskRecord

if TYPE_CHECKING:
    from ..presses import Prefill


class PrefillObserver(Protocol):
    """What an exact prefill hands each layer to (a probe, `probes.Probe.prefilled`)."""

    def prefilled(self, prefill: Prefill) -> None: ...


@dataclass(frozen=True)
class TokenizedQuestion:
    """One question of an example, tokenized: its `index` within the record's line, its `ids` (n,) decoded after the
    context (the question, the chat template's suffix and the answer prefix) and its `needle`, the context positions
    of its own answers."""

    index: int
    ids: torch.Tensor
    needle: np.ndarray


@dataclass(frozen=True)
class Example:
    """One record ready to run: its context ids (L,) prefilled and every question it `asked`, tokenized (one, or a
    many-question record's, each answered on its own from the same compressed context); `question_tokens`,
    query-aware, the record's question's own tokens (tokenized alone, as FINCH counts those after its delimiter),
    which end the context (0: the question is not in the context)."""

    record: TaskRecord
    context_ids: torch.Tensor
    asked: tuple[TokenizedQuestion, ...]
    question_tokens: int = 0

    @property
    def context(self) -> int:
        return self.context_ids.shape[-1]

    @property
    def tokens(self) -> int:
        """The positions the example occupies: its context, its longest question and the tokens it may generate."""
        longest = max(asked.ids.shape[-1] for asked in self.asked)
        return self.context + longest + self.record.max_new_tokens

    @property
    def length(self) -> int:
        """The record's length (as its generator fitted it), else the tokens it occupies."""
        return self.record.length if self.record.length is not None else self.tokens


def prepare(tokenizer, record: TaskRecord, query_aware: bool) -> Example:
    """The record's prompt ids, as kvpress's pipeline tokenizes them, and every question's ids and needle (query-aware,
    the one question joins the context: a many-question record is split first, `selection.units`)."""
    if query_aware and record.many:
        raise ValueError("a many-question record is split into one record per question before a query-aware run")
    compressed = record.context + record.asked[0].text if query_aware else record.context
    context = chat_prompt(tokenizer, compressed, "", record.answer_prefix).context
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    start = len(context) - len(compressed)

    def question_ids(text: str) -> torch.Tensor:
        question = chat_prompt(tokenizer, compressed, text, record.answer_prefix).question
        return torch.tensor(tokenizer.encode(question, add_special_tokens=False), dtype=torch.long)

    def needle(answers: tuple[str, ...]) -> np.ndarray:
        return needle_tokens(tokenizer, context, start, record.context, answers, context_ids)

    asked = tuple(TokenizedQuestion(asked.index, question_ids("" if query_aware else asked.text), needle(asked.answers))
                  for asked in record.asked)
    in_view = len(tokenizer.encode(record.asked[0].text, add_special_tokens=False)) if query_aware else 0
    return Example(record, torch.tensor(context_ids, dtype=torch.long), asked, question_tokens=in_view)


@dataclass
class TaskBatch:
    """Examples of the run decoded together: their positions in the records evaluated."""

    index: list[int]


class TaskSource(OfLoadedModel):
    """Task records through a pretrained decoder (see the module docstring); `reads`: what the prefill computes
    beyond the cache, because a chosen press reads it (the names of `kv.passes`: the attention each key received,
    pre-RoPE queries, attention inputs, the whole-model passes' scores); `questioned`: the presses that read a query-aware
    question's tokens as their window (finch); `left_out`: the file's tasks no evaluated record has."""

    def __init__(self, config: RunConfig, device: str | torch.device, records: Sequence[TaskRecord], *,
                 query_aware: bool, reads: Sequence[str], windowed: bool, left_out: Sequence[str] = (),
                 questioned: Sequence[str] = ()) -> None:
        self.config, self.where, self.records = config, device, list(records)
        self.query_aware, self.reads, self.windowed = query_aware, tuple(reads), windowed
        self.questioned = list(questioned)
        self.repetition: reconstruction.Repetition | None = None
        self.left_out = list(left_out)
        self.content = data.file_content(Path(config.data))
        self.examples: list[Example] = []
        self.n = max((record.length or 0 for record in self.records), default=0)

    def data(self) -> dict[str, Any]:
        """What run.json records of the task file (the records evaluated; the tasks --samples left out, if any), and
        what a resumed run must find again."""
        left_out = {"tasks_left_out": self.left_out} if self.left_out else {}
        return {"name": Path(self.config.data).name, "source": self.config.data, "format": "tasks",
                "records": len(self.records), **left_out, **self.content}

    def start(self) -> None:
        """Read every record's prompt with the model's tokenizer, refuse a question longer than a press reading it
        can take (`check_questions`) before the weights load, then load them and refuse what does not fit."""
        config = self.config
        found = checkpoints.inspect(config.model, config.gguf_file)
        tokenizer = models.load_tokenizer(found, trust_remote_code=config.trust_remote_code)
        self.examples = [prepare(tokenizer, record, self.query_aware) for record in self.records]
        self.check_questions()
        self.loaded = models.load(found, device=self.where, dtype=config.dtype, lm_head=True,
                                  trust_remote_code=config.trust_remote_code, tokenizer=tokenizer)
        loaded = self.loaded
        if not loaded.causal or loaded.head is None:
            raise SpectraError(f"{loaded.name} is not a causal language model: the task protocol decodes answers")
        self.repetition = (reconstruction.Repetition.of(loaded.tokenizer) if passes.needed(self.reads, "repetition")
                           else None)
        for example in self.examples:
            line = f"{Path(config.data).name} line {example.record.example + 1}"
            if example.tokens > loaded.max_length:
                longest = example.tokens - example.context - example.record.max_new_tokens
                raise SpectraError(f"{line}: its prompt ({example.context} context + {longest} "
                                   f"question tokens) and {example.record.max_new_tokens} new tokens exceed the "
                                   f"{loaded.max_length} positions of {loaded.name}")
            if self.windowed and example.context <= WINDOW:
                *others, last = [name if name in PRESSES.bare() else PRESSES.listing_of(name)
                                 for name in windowed_presses()]
                named = f"{', '.join(others)} and {last}" if others else last
                raise SpectraError(f"{line}: its context has {example.context} tokens; {named} read the last {WINDOW} "
                                   "context queries and need more")
        self.n = max(example.tokens for example in self.examples)

    def check_questions(self) -> None:
        """Refuse (one line, naming the record and the limit) a query-aware question of more tokens than the WINDOW
        queries the prefill keeps, where a chosen press reads the question's tokens as its window (finch), counted as
        the press counts them (`Example.question_tokens`: the question tokenized alone)."""
        if not self.questioned:
            return
        for example in self.examples:
            if example.question_tokens > WINDOW:
                named, one = " and ".join(self.questioned), len(self.questioned) == 1
                raise SpectraError(f"{Path(self.config.data).name} line {example.record.example + 1}: its question "
                                   f"has {example.question_tokens} tokens, but {named} "
                                   f"{'reads it as its' if one else 'read it as their'} window of at most {WINDOW} "
                                   "(the context queries the prefill keeps); shorten the question or drop "
                                   f"{named} from {spell('--presses')}")

    def prefill_bytes(self) -> float:
        """What the longest example's prefill holds (every layer's keys, values, pre-RoPE keys and window rows — and
        pre-RoPE queries or attention inputs for a press reading them —, one chunk's scores and softmax) and its full
        cache for decoding: the loop's memory check."""
        loaded, n = self.loaded, self.n
        dim = loaded.head_dim or 64
        itemsize = torch.finfo(loaded.dtype).bits // 8
        width = getattr(getattr(loaded.model, "config", None), "hidden_size", None) or self.heads * dim
        sizes = {"heads": self.heads, "head_dim": dim, "hidden": width}  # what a layer pass holds per token
        held = sum(math.prod(sizes[size] for size in entry.per_token) for entry in passes.layer_passes(self.reads)
                   if entry.per_token)
        per_layer = n * (5 * self.kv_heads * dim + self.heads * WINDOW + held) * itemsize
        return float(loaded.layers * per_layer + 3 * prefill.CHUNK_BYTES)

    def smallest_decode_bytes(self) -> int:
        """The bytes the largest cell of the longest example takes while it decodes (`kv.batching`): its full
        context cache and room for its question and answer, once per question of the example (each question a row
        of its own) — the smallest --decode-memory that works."""
        loaded = self.loaded
        dim = loaded.head_dim or 64
        row = batching.batch_row_bytes(self.kv_heads, dim, dim, torch.finfo(loaded.dtype).bits // 8)
        return max((len(example.asked) * loaded.layers * example.tokens * row for example in self.examples),
                   default=0)

    def describe(self) -> dict[str, Any]:
        loaded = self.loaded
        return {"model": loaded.describe(), "data": self.data(), "n": self.n, "device": str(loaded.device),
                "dtype": self.config.dtype}

    def batches(self, sequences: int, skip: int = 0, shard: tuple[int, int] = (0, 1),
                held: Container[int] = ()) -> Iterator[TaskBatch]:
        """Up to `--batch-size` examples per batch from `skip` on, in order, leaving out those checkpoints hold
        (`held`) (the probe decodes their cells together; each is prefilled alone); example i goes to process i mod
        size (of those left: `distributed.share`)."""
        mine = list(distributed.share(range(skip, min(sequences, len(self.records))), held, shard))
        step = self.config.batch_size
        for first in range(0, len(mine), step):
            yield TaskBatch(mine[first:first + step])

    def run(self, batch: TaskBatch, probe: PrefillObserver) -> None:
        """Each example's exact prefill, one after the other; each layer's `Prefill` to the probe's `prefilled`
        (layer 0 begins the next example)."""
        for position in batch.index:
            example = self.examples[position]
            ids = example.context_ids.to(self.device)
            found = prefill.exact(self.loaded.model, self.layers, ids, self.config.seed, example.record.example,
                                  self.reads, repetition=self.repetition)
            for layer in found:  # query-aware: how many of the context's last tokens are the question (finch's window)
                probe.prefilled(replace(layer, question_tokens=example.question_tokens) if example.question_tokens
                                else layer)
