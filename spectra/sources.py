"""Where captured layers come from: a pretrained model reading a corpus, or Gaussian q, k, v.

The loop asks a source for its batches and runs each one, handing every captured layer to the probes:

- `ModelSource`: the corpus's token blocks through the model with the capture attention active (one
  `Captured` per layer and batch); `forward` also serves end to end's exact and substituted passes;
- `SyntheticSource`: i.i.d. N(0, 1) q, k, v of n tokens and d dimensions as one layer — no model, no corpus.

Both describe themselves for run.json (model, data, n, device). Every record either makes carries the
global indices of its batch's sequences (`Captured.index`), on which all per-sequence randomness is seeded.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from . import capture, checkpoints, data, distributed, models, sliding
from .capture import Captured, Observe, Substitute
from .config import RunConfig
from .errors import InternalError, SpectraError
from .seeds import Domain, derive_seed



class Observer(Protocol):
    """What a forward pass hands each layer to (a probe, `probes.Probe.update`)."""

    def update(self, captured: Captured) -> None: ...


class OfLoadedModel:
    """What a source reading through a loaded model (`self.loaded`, a `models.Loaded`) says of it: its layers, query
    and key/value heads, device and shape — shared by the corpus source here and the task source of `spectra.kv.tasks`."""

    loaded: models.Loaded

    @property
    def layers(self) -> int:
        return self.loaded.layers

    @property
    def heads(self) -> int:
        return self.loaded.heads

    @property
    def kv_heads(self) -> int:
        return self.loaded.kv_heads or self.loaded.heads

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    def shape(self) -> checkpoints.Shape:
        """The loaded model's shape, for the checks an analysis makes before loading when the files tell it."""
        loaded = self.loaded
        config = getattr(loaded.model, "config", None)
        return checkpoints.Shape(loaded.layers, loaded.heads, loaded.max_length, loaded.causal, loaded.name,
                                 self.kv_heads, getattr(config, "hidden_size", None),
                                 None if config is None else sliding.windowed(config))


class ModelSource(OfLoadedModel):
    """A corpus read through a pretrained model. Opening reads the data (so data errors come first and a
    resumed run can compare what it read); `start` loads the model and checks the two fit together."""

    def __init__(self, config: RunConfig, device: str | torch.device, *, lm_head: bool = False,
                 fit_samples: int = 0, keep_logits: int = 0) -> None:
        """`fit_samples`: the calibration sequences that come first (no batch straddles their end); `keep_logits`:
        the last positions whose logits `run` keeps in `logits` for the probes (0: none)."""
        self.config, self.where, self.lm_head, self.fit_samples = config, device, lm_head, fit_samples
        self.keep_logits, self.logits = keep_logits, None
        self.corpus = data.open_corpus(config.data, split=config.split, text_column=config.text_column,
                                       seed=config.seed)
        self.n = config.length

    def data(self) -> dict[str, Any]:
        """What run.json records of the data, and what a resumed run must find again."""
        return {**self.corpus.describe(), "mode": self.config.mode}

    def start(self) -> None:
        config = self.config
        self.loaded = models.load(checkpoints.inspect(config.model, config.gguf_file), device=self.where,
                                  dtype=config.dtype, lm_head=self.lm_head, trust_remote_code=config.trust_remote_code)
        share = data.unknown_share(self.loaded.tokenizer, self.corpus.documents)
        if share > data.MAX_UNKNOWN_SHARE:
            raise SpectraError(
                f"the tokenizer of {self.loaded.name} maps {share:.0%} of the words of '{config.data}' to its unknown "
                "token: it does not fit this text (or its vocabulary is missing); use the model's own tokenizer"
            )
        if self.n > self.loaded.max_length:
            raise SpectraError(f"--length {self.n} exceeds what {self.loaded.name} can embed "
                               f"({self.loaded.max_length} tokens)")
        if config.mode == "pack" and next(data.sequences(self.loaded.tokenizer, self.corpus, self.n, "pack"),
                                          None) is None:
            raise SpectraError(
                f"data '{config.data}' is too short to make one sequence of {self.n} tokens in pack mode; "
                "use a smaller --length, more text or --mode truncate"
            )

    def describe(self) -> dict[str, Any]:
        loaded = self.loaded
        return {
            "model": loaded.describe(),
            "data": {**self.data(), **data.framing(loaded.tokenizer, self.config.mode)},
            "n": self.n,
            "device": str(loaded.device),
            "dtype": self.config.dtype,
        }

    def batches(self, sequences: int, skip: int = 0, shard: tuple[int, int] = (0, 1),
                held: Container[int] = ()) -> Iterator[data.Batch]:
        return data.batches(self.loaded.tokenizer, self.corpus, self.n, self.config.mode, sequences,
                            self.config.batch_size,
                            skip=skip, shard=shard, fit_samples=self.fit_samples, held=held)

    def run(self, batch: data.Batch, probe: Observer) -> None:
        """The batch's forward pass, every layer handed to the probe's `update` (its records know the sequences'
        indices); with
        `keep_logits`, the logits of the last positions are kept in `logits` (B, keep_logits, vocab)."""
        keep = {"logits_to_keep": self.keep_logits} if self.keep_logits else {}
        outputs = self.forward(batch.input_ids, batch.attention_mask, observe=probe.update, index=batch.index, **keep)
        self.logits = outputs.logits if self.keep_logits else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, index: Sequence[int],
                observe: Observe | None = None, substitute: Substitute | None = None, **extra: Any) -> Any:
        """One forward pass with capture active (and a substitution, if given); returns the model's outputs.
        `index`: the sequences' global indices, which every captured record carries (required: a substitution
        drawing per sequence and every probe seed by them).

        A decoder gets position ids counted from each sequence's first valid token (as generation does), so a
        left-padded sequence is encoded exactly as it is alone; encoders compute their own. `extra`: more keywords
        for the model (e.g. logits_to_keep)."""
        if len(index) != input_ids.shape[0]:
            raise InternalError(f"{len(index)} sequence indices for a batch of {input_ids.shape[0]} sequences")
        loaded = self.loaded
        mask = attention_mask.to(loaded.device)
        positions = {"position_ids": (mask.cumsum(-1) - 1).clamp_min(0)} if loaded.causal else {}
        return capture.forward(loaded.model, loaded.layers, observe, substitute, index, input_ids=input_ids.to(loaded.device),
                               attention_mask=mask, output_hidden_states=loaded.head is not None, **positions,
                               **extra)


def gaussian_qkv(
    n: int, d: int, *, heads: int = 1, batch: int = 1, seed: int = 0, std: float = 1.0,
    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """i.i.d. N(0, std²) q, k, v of shape (batch, heads, n, d), seeded: the probes' input without a model."""
    if n < 1 or d < 1 or heads < 1 or batch < 1:
        raise SpectraError(f"n, d, heads and batch must be ≥ 1, got {n}, {d}, {heads}, {batch}")
    drawn = np.random.default_rng(derive_seed(seed, Domain.SYNTHETIC)).standard_normal((3, batch, heads, n, d)) * std
    q, k, v = torch.from_numpy(drawn).to(device=device, dtype=dtype)
    return q, k, v


@dataclass
class SyntheticBatch:
    """Samples of a synthetic run, by their indices (consecutive unless a checkpoint holds some between)."""

    index: list[int]

    @property
    def start(self) -> int:
        return self.index[0]

    @property
    def size(self) -> int:
        return len(self.index)


class SyntheticSource:
    """Gaussian q, k, v as one layer of `heads` heads; sample i is drawn from a seed fixed by (seed, i), so the
    draws depend on neither the batch size nor the number of processes (and a run may resume with another)."""

    layers = 1

    def __init__(self, config: RunConfig, d: int, heads: int, device: str | torch.device) -> None:
        """n = `config.length` tokens of dimension `d` in `heads` heads per sample."""
        self.config, self.n, self.d, self.heads = config, config.length, d, heads
        self.device = models.pick_device(device)

    def data(self) -> dict[str, Any]:
        return {"name": "synthetic"}

    def start(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"model": {"name": f"gaussian(d={self.d})", "layers": 1, "heads": self.heads},
                "data": self.data(), "n": self.n, "device": str(self.device)}

    def batches(self, sequences: int, skip: int = 0, shard: tuple[int, int] = (0, 1),
                held: Container[int] = ()) -> Iterator[SyntheticBatch]:
        """Batches of the run's batch size from `skip` on, of the samples no checkpoint holds (`held`); with several
        processes, batch b goes to process b mod size."""
        left, batch_size = list(distributed.share(range(skip, sequences), held)), self.config.batch_size
        batched = [left[start:start + batch_size] for start in range(0, len(left), batch_size)]
        yield from (SyntheticBatch(index) for index in distributed.share(batched, (), shard))

    def run(self, batch: SyntheticBatch, probe: Observer) -> None:
        config = self.config
        drawn = [gaussian_qkv(self.n, self.d, heads=self.heads, seed=derive_seed(config.seed, index),
                              device=self.device) for index in batch.index]
        q, k, v = (torch.cat(parts) for parts in zip(*drawn))
        probe.update(Captured.of(0, q, k, v, index=tuple(batch.index)))
