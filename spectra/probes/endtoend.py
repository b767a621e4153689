"""End to end: substitute an approximation into the forward pass and measure what the model loses.

For every batch the exact model and each (method, budget) substitution run on the same inputs, and the
drift of the last hidden states is measured: the relative Frobenius error per sequence and the mean
cosine similarity per valid token. With a language-model head, the loss too:

- masked-LM head (encoders): the inputs carry a seeded 15% masking (every chosen token replaced by the
  mask token; special and padding tokens never chosen); the loss is summed over the masked tokens;
- causal-LM head (decoders): the next-token loss on the plain inputs, the standard shifted loss summed
  over every predicted position (a valid token following a valid token).

Perplexity = exp(total loss / scored tokens), exact against approximated on the same tokens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping

import numpy as np
import pandas as pd
import torch

from ..capture import Substitute
from ..data import Batch
from ..models import CAUSAL_LM, MASKED_LM, Loaded
from ..seeds import Domain, derive_seed
from ..stats import State, tagged
from .base import Probe

if TYPE_CHECKING:
    from ..sources import ModelSource

MASK_RATE = 0.15
#: per (method, budget): sequences, Σ hidden relative error, Σ token cosine, tokens, Σ loss, scored tokens
_FIELDS = ("sequences", "hidden_err", "cosine", "tokens", "loss", "masked")
#: the column counting scored tokens, by head
_SCORED = {MASKED_LM: "masked_tokens", CAUSAL_LM: "predicted_tokens"}


def next_token_labels(batch: Batch) -> torch.Tensor:
    """Labels aligned with the logits of positions 0…n−2: the next token where both it and the position that
    predicts it are valid, −100 elsewhere (padding on either side is never scored)."""
    ids, valid = batch.input_ids, batch.attention_mask.bool()
    labels = torch.full_like(ids, -100)
    scored = valid[:, 1:] & valid[:, :-1]
    labels[:, :-1] = torch.where(scored, ids[:, 1:], -100)
    return labels


def mask_tokens(batch: Batch, loaded: Loaded, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids with seeded MASK_RATE masking and labels (-100 where not masked); sequence i of the run
    always gets the same mask, whatever the batching or the number of processes."""
    tokenizer = loaded.tokenizer
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)))
    ids, labels = batch.input_ids.clone(), torch.full_like(batch.input_ids, -100)
    for row in range(ids.shape[0]):
        generator = torch.Generator().manual_seed(derive_seed(seed, Domain.MASK, batch.index[row]))
        chosen = torch.rand(ids.shape[1], generator=generator) < MASK_RATE
        chosen &= batch.attention_mask[row].bool() & ~torch.isin(ids[row], special)
        labels[row, chosen] = ids[row, chosen]
        ids[row, chosen] = tokenizer.mask_token_id
    return ids, labels


class EndToEnd(Probe):
    """Owns one substitution per (method, budget[, allocation]) and, after each batch, runs the exact model and
    every substitution on it: hidden-state drift and (with an LM head) the loss per substitution. Batches of
    the first `fit_samples` sequences (a calibration set) are left out."""

    def __init__(self, source: "ModelSource", substitutes: dict[tuple, Substitute], seed: int,
                 layers: str = "all") -> None:
        self.source, self.substitutes, self.seed, self.layers = source, substitutes, seed, layers
        self.keys = list(substitutes)
        self.sums = np.zeros((len(self.keys) + 1, len(_FIELDS)))  # row 0: the exact model

    def after_batch(self, batch: Batch) -> None:
        """Exact and substituted forward passes of one batch."""
        if min(batch.index) < self.source.fit_samples:
            return
        loaded = self.source.loaded
        if loaded.head == MASKED_LM:
            ids, labels = mask_tokens(batch, loaded, self.seed)
        elif loaded.head == CAUSAL_LM:
            ids, labels = batch.input_ids, next_token_labels(batch)
        else:
            ids, labels = batch.input_ids, None
        valid = batch.attention_mask.to(loaded.device).bool()
        exact = self.source.forward(ids, batch.attention_mask, index=batch.index)
        exact_hidden = _last_hidden(exact).float()
        self._add(0, exact_hidden, exact_hidden, exact, labels, valid, loaded)
        for row, key in enumerate(self.keys, start=1):
            approx = self.source.forward(ids, batch.attention_mask, substitute=self.substitutes[key], index=batch.index)
            self._add(row, _last_hidden(approx).float(), exact_hidden, approx, labels, valid, loaded)

    def _add(self, row: int, hidden, exact_hidden, outputs, labels, valid, loaded: Loaded) -> None:
        weight = valid[..., None].to(hidden.dtype)
        diff = ((hidden - exact_hidden) * weight).flatten(1).norm(dim=-1)
        err = diff / (exact_hidden * weight).flatten(1).norm(dim=-1).clamp_min(torch.finfo(hidden.dtype).tiny)
        cosine = torch.nn.functional.cosine_similarity(hidden, exact_hidden, dim=-1)[valid]
        loss, masked = 0.0, 0
        if labels is not None:
            labels = labels.to(loaded.device)
            loss = torch.nn.functional.cross_entropy(
                outputs.logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum").item()
            masked = int((labels != -100).sum())
        self.sums[row] += [hidden.shape[0], err.sum().item(), cosine.sum().item(), cosine.numel(), loss, masked]

    def state(self) -> State:
        return tagged({"end_to_end.sums": self.sums})

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.sums = np.array(arrays["end_to_end.sums"])

    def tables(self) -> dict[str, pd.DataFrame]:
        """end_to_end.csv: one row per (method, budget[, allocation: a k plan or the uniform k of equal cost]):
        hidden drift, exact vs approximate loss and perplexity."""
        layers = self.layers
        exact = dict(zip(_FIELDS, self.sums[0]))
        rows = []
        for key, sums in zip(self.keys, self.sums[1:]):
            s = dict(zip(_FIELDS, sums))
            row = {"method": key[0], "budget": key[1], **({"allocation": key[2]} if len(key) > 2 else {}),
                   "layers": layers, "sequences": int(s["sequences"]),
                   "hidden_rel_err": s["hidden_err"] / max(s["sequences"], 1),
                   "cosine": s["cosine"] / max(s["tokens"], 1)}
            if exact["masked"] > 0:
                loss_exact, loss = exact["loss"] / exact["masked"], s["loss"] / s["masked"]
                row.update({_SCORED[self.source.loaded.head]: int(s["masked"])}, loss_exact=loss_exact, loss=loss,
                           ppl_exact=math.exp(loss_exact), ppl=math.exp(loss),
                           ppl_change=math.exp(loss) / math.exp(loss_exact) - 1)
            rows.append(row)
        return {"end_to_end.csv": pd.DataFrame(rows)}


def _last_hidden(outputs) -> torch.Tensor:
    hidden = getattr(outputs, "hidden_states", None)
    return hidden[-1] if hidden is not None else outputs.last_hidden_state
