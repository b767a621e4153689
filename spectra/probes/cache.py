"""`spectra cache`'s probe: each sequence's exact prefill compressed by every (press, ratio), the continuation scored
against each compressed cache, and the losses accumulated (see `spectra.kv.continuation` for the engine).

`update` sees every layer of the loop's forward pass over the L + C tokens: it reads the layer's prefill, hands it to
every cell of the sequence (`spectra.kv.cell`: one per press and ratio, which compresses it and counts the rows and bytes
kept), measures each head with the layer's exact inputs (attention mass kept, output error) and keeps the cells;
`after_batch` scores the continuation against their caches, all the cells that compress once in one batched forward
pass per chunk, each that compresses while decoding teacher-forced by its recompression, and accumulates next-token NLL,
KL from the full cache's distribution and top-1 agreement. A sequence shorter than L + C tokens (truncate mode) is
skipped and counted. The prefill passes the run's presses read (`kv.passes`) are computed as the layers go by; a
press reading a whole-model pass (kvzip, kvcompose, kvgrad) reads every layer's cache, so its cells wait: `update`
keeps each layer's continuation rows for them (`continuation.Tail`), and `after_batch` first runs the passes they read
over the sequence's prefilled cache (`prefill.scored`), then compresses and measures them layer by layer. A
sliding-window layer's prefill carries its window: the cell leaves it what `--local-layers` says (`kv.locallayers`),
the continuation attends through the window (`kv.continuation`), and a head's bytes share is over what its layer stores.

With `fit_samples` N > 0 the first N sequences calibrate: their prefills go to the run's own fresh instance of each
press that `calibrates` (never to the registry's shared one), nothing is scored, and the sequences after them are
evaluated with that fit frozen. The fit's statistics are part of the checkpointed state (a resumed run goes on from
the same float64 sums) and are written as calibration.npz.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..kv import axes, continuation, generation, passes, prefill, reconstruction
from .. import models, sliding
from ..config import LocalLayers
from ..capture import Captured
from ..kv.cell import Cell, Cells
from ..errors import SpectraError
from ..kv.presses import Prefill, Press
from ..kv.presses.decoding import INTERVAL
from ..stats import State, tagged
from .base import Probe

if TYPE_CHECKING:
    from ..sources import ModelSource

#: logits held at once by the continuation's batched forward pass (bytes): rows are chunked to stay under it
LOGIT_BYTES = 2**28
#: per (press, ratio): sequences, Σ NLL, Σ KL, Σ top-1 agreement, tokens, Σ kept rows (mean over layers and heads),
#: Σ memory saved, Σ bytes of the compressed context cache and of the full one (all layers and key/value heads)
_FIELDS = ("sequences", "nll", "kl", "top1", "tokens", "kept", "saved", "bytes", "full_bytes")
#: per (press, ratio, sequence): NLL, KL, top-1 agreement (means over the continuation's tokens)
_PER_SEQUENCE = ("nll", "kl", "top1")


class CacheProbe(Probe):
    """Every (press, ratio) of `presses` × `ratios` beside the full cache, on sequences of `context` + `continuation`
    tokens; `seed` is the run's (the random press draws from it); `evaluated` are the global indices of the
    sequences scored (they size the per-sequence table): the `evaluated.start` sequences before them calibrate
    the presses that fit (see the module docstring)."""

    def __init__(self, source: "ModelSource", presses: Sequence[str], ratios: Sequence[float], context: int,
                 continuation: int, seed: int, evaluated: range, bytes_kept: Sequence[float] = (),
                 diagnosis: pd.DataFrame | None = None, compression_interval: int = INTERVAL,
                 local_layers: LocalLayers = LocalLayers.KEEP) -> None:
        self.source, self.context, self.continuation, self.seed = source, context, continuation, seed
        self.bytes_kept, self.diagnosis = tuple(bytes_kept), diagnosis
        self.fit_samples, samples = evaluated.start, len(evaluated)
        # the run's own presses: a calibrating press's fit belongs to this run, not to the shared registry
        loaded = source.loaded
        self.windows = sliding.of_model(loaded.model)  # each layer's sliding window (None: global)
        self.cells = Cells(presses, ratios, local_layers, compression_interval=compression_interval,
                           layers=loaded.layers, windows=self.windows)
        self.presses: dict[str, Press] = self.cells.presses
        self.calibrated = np.zeros(1)  # calibration sequences used (long enough)
        self.variants = self.cells.variants
        self.layers, self.heads = loaded.layers, loaded.heads
        count = len(self.variants)
        self.sums = np.zeros((count, len(_FIELDS)))
        self.head_sums = np.zeros((count, self.layers, self.heads, 3))  # Σ mass kept, Σ output error, Σ bytes share
        self.head_counts = np.zeros(1)
        self.head_kept = np.zeros((count, self.layers, loaded.kv_heads or self.heads))  # Σ share of context rows kept per KV head
        self.per_sequence = np.zeros((len(_PER_SEQUENCE), samples, count))
        self.scored = np.zeros(samples)
        self.skipped = np.zeros(1)
        # per sequence awaiting its continuation: each layer's prefill (the keys and values kept), its cells, and
        # for cells whose press reconstructs (compressed after the forward pass) each layer's continuation rows
        self.pending: dict[int, tuple[dict[int, Prefill], list[Cell], dict[int, continuation.Tail]]] = {}
        self.repetition: reconstruction.Repetition | None = None  # the reconstruction prompts, made on first use
        self.pre_rope: dict[int, torch.Tensor] = {}
        self.reads = passes.read_by(presses)  # the prefill passes its presses read
        self.hooked: dict[int, dict[str, torch.Tensor]] = {}  # each layer's hooked outputs they need ("q", "input")
        self.rope = models.rope(loaded.model)
        self.hooks = models.watch_projections(loaded.model, self._projection) if models.rotary(loaded.model) else []
        if passes.needed(self.reads, "input"):
            self.hooks += models.watch_inputs(loaded.model, lambda layer, found: self._hooked(layer, "input", found))
        self.w_o = models.output_projections(loaded.model)  # each layer's W^O, for the presses that read it

    def _projection(self, layer: int, which: str, output: torch.Tensor) -> None:
        if which == "k":
            self.pre_rope[layer] = output
        elif which == "q" and passes.needed(self.reads, "q"):
            self._hooked(layer, "q", output)

    def _hooked(self, layer: int, name: str, output: torch.Tensor) -> None:
        self.hooked.setdefault(layer, {})[name] = output

    def _usable(self, captured: Captured, row: int) -> bool:
        return captured.q.shape[-2] == self.context + self.continuation and bool(captured.valid[row].all())

    def update(self, captured: Captured) -> None:
        """One layer: each usable sequence's prefill, compressed by every (press, ratio), measured per head."""
        context, layer = self.context, captured.layer
        index = captured.sequence_index()
        for row in range(captured.q.shape[0]):
            if not self._usable(captured, row):
                continue
            pre = self.pre_rope.get(layer)  # (B, n, H_kv·d) → (H_kv, L, d)
            key_pre = None if pre is None else pre[row, :context].unflatten(-1, (captured.key.shape[1], -1))
            key_pre = None if key_pre is None else key_pre.transpose(0, 1)
            hooked = {name: found[row, :context] for name, found in self.hooked.get(layer, {}).items()}
            prefilled = continuation.from_captured(captured, row, context, key_pre, self.seed, index[row],
                                                   self.w_o.get(layer), self.rope, reads=self.reads, hooked=hooked,
                                                   sliding_window=self.windows[layer])
            if index[row] < self.fit_samples:
                self._calibrate(prefilled)
                continue
            if index[row] not in self.pending:
                self.pending[index[row]] = ({}, list(self.cells.of(context, self.seed, index[row])), {})
            prefills, cells, tails = self.pending[index[row]]
            tail = continuation.Tail.of(captured, row, context)
            now = [i for i, cell in enumerate(cells) if not self._reconstructs(cell)]
            self._measure(layer, [cells[i] for i in now], now, tail, prefilled)
            if len(now) < len(cells):  # a press that reconstructs compresses after the pass, measured then
                tails[layer] = tail.kept()
            # the prefill's tensors are views of the whole layer's: keep copies of what the continuation needs
            prefills[layer] = Prefill(layer, prefilled.q[:, :0], prefilled.key.clone(), prefilled.value.clone(), None,
                                      prefilled.window[:, :0], prefilled.scaling, self.seed, index[row],
                                      sliding_window=prefilled.sliding_window)
        self.pre_rope.pop(layer, None)
        self.hooked.pop(layer, None)

    @staticmethod
    def _reconstructs(cell: Cell) -> bool:
        """Whether a cell's press reads a whole-model pass (`kv.passes`), run over every layer after the prefill."""
        return cell.compressor is not None and bool(passes.whole_model_passes(cell.compressor.reads))

    def _measure(self, layer: int, cells: list[Cell], rows: list[int], tail: continuation.Tail,
                 prefilled: Prefill) -> None:
        """`cells` (rows `rows` of the tables) compress one layer and are measured per head against its `tail`."""
        if not cells:
            return
        context = self.context
        parts = [cell.compress(prefilled) for cell in cells]
        mass, error = continuation.tail_measures(tail, parts, prefilled)
        during = torch.tensor([cell.decodes for cell in cells], device=mass.device)
        mass[during], error[during] = float("nan"), float("nan")  # its cache changes while decoding: not one
        self.head_sums[rows, layer, :, 0] += mass.double().cpu().numpy()
        self.head_sums[rows, layer, :, 1] += error.double().cpu().numpy()
        # each query head: its key/value head's bytes, over what the full cache stores there (a local layer's window)
        shares = torch.stack([cell.memory(layer).double() / cell.whole(layer) * prefilled.kv_heads for cell in cells])
        self.head_sums[rows, layer, :, 2] += shares.repeat_interleave(prefilled.groups, dim=1).numpy()
        self.head_kept[rows, layer] += np.stack([cell.counts(layer) for cell in cells]) / context

    def _reconstruct(self, ids: torch.Tensor, index: int, prefills: dict[int, Prefill], cells: list[Cell],
                     tails: dict[int, continuation.Tail]) -> None:
        """The whole-model passes the cells' presses read over the sequence's prefilled context `ids` (L,), then every
        layer of those cells, compressed with the scores and measured."""
        rows = [i for i, cell in enumerate(cells) if self._reconstructs(cell)]
        if not rows:
            return
        loaded = self.source.loaded
        if self.repetition is None:
            self.repetition = reconstruction.Repetition.of(loaded.tokenizer)
        reads = [name for i in rows for name in cells[i].compressor.reads]
        layers = prefill.scored(loaded.model, self.layers, [prefills[layer] for layer in range(self.layers)], ids,
                                index, reads, self.repetition)
        for layer, prefilled in enumerate(layers):
            self._measure(layer, [cells[i] for i in rows], rows, tails.pop(layer), prefilled)

    def _calibrate(self, prefilled: Prefill) -> None:
        """One calibration sequence's layer, added to every calibrating press of the run."""
        for press in self.presses.values():
            if press.calibrates:
                press.calibrate(prefilled)
        if prefilled.layer == 0:
            self.calibrated += 1

    def after_batch(self, batch: Any) -> None:
        """Score each pending sequence's continuation against its compressed caches (a calibration batch — no batch
        straddles the end of the calibration — has none: it is refused if no calibration sequence was usable)."""
        if min(batch.index) < self.fit_samples:
            if max(batch.index) == self.fit_samples - 1 and not self.calibrated[0]:
                raise SpectraError(f"none of the {self.fit_samples} calibration sequences has {self.context} + "
                                   f"{self.continuation} tokens (truncate mode skips shorter ones); use --mode pack, "
                                   "a shorter --context or more text")
            return
        rows = {index: row for row, index in enumerate(batch.index)}
        self.skipped += len(batch.index) - len(self.pending)
        for index, (prefills, cells, tails) in self.pending.items():
            ids = batch.input_ids[rows[index], :self.context].to(self.source.loaded.device)
            self._reconstruct(ids, index, prefills, cells, tails)
            self._score(batch, rows[index], index, prefills, cells)
        self.pending = {}

    def _score(self, batch: Any, row: int, index: int, prefills: dict[int, Prefill], cells: list[Cell]) -> None:
        """Every cell's per-token measures: the cells that compress once in batched passes (the full cache's first:
        the reference), each that decodes teacher-forced on its own (`generation.teacher_forced`)."""
        loaded, context = self.source.loaded, self.context
        tokens = batch.input_ids[row].to(loaded.device)
        targets = tokens[context:]
        first = self.source.logits[row, 0].double()  # the context's last position: no press changes it
        chunk = max(1, int(LOGIT_BYTES // (4 * max(1, self.continuation - 1) * first.shape[-1])))
        once = [i for i, cell in enumerate(cells) if not cell.decodes]
        measured: dict[int, list[torch.Tensor]] = {}
        saved: dict[int, float] = {}  # cell that decodes → the memory it saved
        reference = None
        for start in range(0, len(once), chunk):
            chosen = once[start:start + chunk]
            stacked = {layer: continuation.stack([cells[i].parts[layer] for i in chosen], kept.key, kept.value,
                                                 kept.sliding_window) for layer, kept in prefills.items()}
            rest = continuation.continuation_logits(loaded.model, self.layers, stacked.__getitem__, tokens[context:-1],
                                                    [cells[i].start for i in chosen], index, len(chosen))
            logits = torch.cat([first.expand(len(chosen), 1, -1).to(rest.dtype), rest], dim=1)
            if reference is None:  # row 0 is the full cache
                reference = torch.log_softmax(logits[0].double(), dim=-1)
            scores = continuation.token_measures(logits, targets, reference)
            for position, i in enumerate(chosen):
                measured[i] = [part[position].double().cpu() for part in scores]
        for i, cell in enumerate(cells):
            if i in measured:
                continue
            rest, saved[i] = self._teacher_forced(cell, prefills, tokens, index)
            logits = torch.cat([first[None].to(rest.dtype), rest])[None]
            measured[i] = [part[0].double().cpu() for part in continuation.token_measures(logits, targets, reference)]
        per_token = [torch.stack([measured[i][j] for i in range(len(cells))]).numpy() for j in range(3)]
        tokens_scored = per_token[0].shape[1]
        for i, cell in enumerate(cells):
            kept = np.mean(cell.counts().mean(axis=1))  # rows kept: the mean over layers of the mean over heads
            self.sums[i] += [1, per_token[0][i].sum(), per_token[1][i].sum(), per_token[2][i].sum(), tokens_scored,
                             kept, saved[i] if cell.decodes else cell.saved(), cell.bytes(), cell.full_bytes()]
            for j, values in enumerate(per_token):
                self.per_sequence[j, index - self.fit_samples, i] = values[i].mean()
        self.scored[index - self.fit_samples] = 1
        self.head_counts += 1

    def _teacher_forced(self, cell: Cell, prefills: dict[int, Prefill], tokens: torch.Tensor,
                        index: int) -> tuple[torch.Tensor, float]:
        """The logits of a cell that decodes for the continuation's tokens 1 … C − 1 (fed one step each from the
        cache its press left after the prefill — the whole one — compressed every `interval` steps), and the memory it
        saved: the mean over those tokens of 1 − rows attended / rows of the full cache."""
        context = self.context
        cache = cell.buffers([prefills[layer] for layer in range(self.layers)], self.continuation)
        recompression = cell.recompression()
        fed = tokens[context:-1]
        logits, attended = generation.teacher_forced(self.source.loaded.model, self.layers, cache, fed, cell.start,
                                                   recompression, index)
        whole = np.arange(context + 1, context + 1 + fed.shape[-1])
        return logits, float(np.mean(1 - np.asarray(attended) / whole))

    def statistics(self) -> dict[str, np.ndarray]:
        """Every calibrating press's gathered statistics, named "<press>|<layer>|<tensor>|<part>"."""
        return {f"{name}|{key}": array for name, press in self.presses.items()
                for key, array in press.statistics().items()}

    def state(self) -> State:
        return tagged({"cache.sums": self.sums, "cache.heads": self.head_sums, "cache.head_counts": self.head_counts,
                       "cache.head_kept": self.head_kept,
                       "cache.sequences": self.per_sequence, "cache.scored": self.scored,
                       "cache.skipped": self.skipped, "cache.calibrated": self.calibrated,
                       **{f"calibration.{key}": array for key, array in self.statistics().items()}})

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.sums, self.head_sums = np.array(arrays["cache.sums"]), np.array(arrays["cache.heads"])
        self.head_counts, self.per_sequence = np.array(arrays["cache.head_counts"]), np.array(arrays["cache.sequences"])
        self.head_kept = np.array(arrays["cache.head_kept"])
        self.scored, self.skipped = np.array(arrays["cache.scored"]), np.array(arrays["cache.skipped"])
        self.calibrated = np.array(arrays["cache.calibrated"])
        for name, press in self.presses.items():
            prefix = f"calibration.{name}|"
            press.load_statistics({key[len(prefix):]: value for key, value in arrays.items()
                                   if key.startswith(prefix)})

    def describe(self) -> dict[str, Any]:
        found = {"scored": int(self.scored.sum()), "skipped": int(self.skipped[0])}
        if self.fit_samples:
            found["calibration"] = {"sequences": [0, self.fit_samples], "used": int(self.calibrated[0]),
                                    "presses": [name for name, press in self.presses.items() if press.calibrates]}
        return found

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """calibration.npz: the calibrating presses' float64 sums (Σx, Σxᵀx, N per press, layer and tensor)."""
        found = self.statistics()
        return {"calibration.npz": found} if self.fit_samples and found else {}

    def tables(self) -> dict[str, pd.DataFrame]:
        """cache.csv (per press and ratio), cache_heads.csv (per press, ratio, layer and head; `kept_share`: the share
        of context rows the head's key/value head kept, the achieved compression per head; `bytes_share`: its bytes
        over the full cache's), cache_sequences.csv (per press, ratio and sequence); the full cache is the row press
        'full', ratio 0. With `bytes_kept`, cache_axes.csv: per byte budget, layer and key/value head, each axis'
        least loss (`spectra.kv.axes`), beside the head's diagnosis when a heads run's is given."""
        rows, heads, sequences = [], [], []
        scored = np.flatnonzero(self.scored)
        for i, (press, ratio) in enumerate(self.variants):
            s = dict(zip(_FIELDS, self.sums[i]))
            count = max(s["sequences"], 1)
            nll = s["nll"] / max(s["tokens"], 1)
            channels = press != "full" and "channels" in self.presses[press].axis.split("+")
            rows.append({"press": press, "ratio": ratio, "nll": nll, "ppl": math.exp(nll),
                         "kl": s["kl"] / max(s["tokens"], 1), "top1": s["top1"] / max(s["tokens"], 1),
                         "kept": s["kept"] / count, "kept_share": s["kept"] / count / self.context,
                         "key_channel_ratio": ratio if channels else 0.0, "saved": s["saved"] / count,
                         "axis": "none" if press == "full" else self.presses[press].axis, "bytes": s["bytes"] / count,
                         "bytes_share": s["bytes"] / max(s["full_bytes"], 1),
                         "sequences": int(s["sequences"]), "tokens": int(s["tokens"])})
            mean = self.head_sums[i] / max(self.head_counts[0], 1)
            kept_share = self.head_kept[i] / max(self.head_counts[0], 1)
            groups = self.heads // kept_share.shape[1]
            for layer in range(self.layers):
                for head in range(self.heads):
                    heads.append({"press": press, "ratio": ratio, "layer": layer, "head": head,
                                  "mass_kept": mean[layer, head, 0], "out_err": mean[layer, head, 1],
                                  "kept_share": kept_share[layer, head // groups], "bytes_share": mean[layer, head, 2]})
            for index in scored:
                sequences.append({"press": press, "ratio": ratio, "sequence": int(index) + self.fit_samples,
                                  **{name: self.per_sequence[j, index, i] for j, name in enumerate(_PER_SEQUENCE)}})
        found = {"cache.csv": pd.DataFrame(rows), "cache_heads.csv": pd.DataFrame(heads),
                 "cache_sequences.csv": pd.DataFrame(sequences)}
        if self.bytes_kept:
            # a decoding press is left out: its cache changes while decoding, so it has no per-head output error;
            # a composition across axes (tokens+channels) too: the map compares single axes
            axes_of = {name: press.axis for name, press in self.presses.items()
                       if not press.decodes and press.axis in axes.AXES}
            mapped = axes.best_axes(found["cache_heads.csv"], axes_of, self.source.kv_heads, self.bytes_kept)
            found["cache_axes.csv"] = mapped if self.diagnosis is None else axes.join_diagnosis(mapped, self.diagnosis)
        return found

    def close(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
