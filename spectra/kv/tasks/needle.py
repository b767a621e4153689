"""Where the answer sits in the prefilled tokens (the needle span), and which layers lost it.

The needle of an example is every context token that overlaps an occurrence of one of its answers: each answer string
is found in the record's context by character offset (every occurrence: passkey writes its key twice, a multi-value
needle holds several answers), shifted by where the context starts in the templated text the model prefills
(`prompt.chat_prompt`'s opening), and mapped to token positions with the tokenizer's offset mapping of that same text.
A tokenizer whose offsets do not reproduce kvpress's ids (a slow tokenizer, one that normalises the text) gives no
needle rather than a wrong one. Torch-free (numpy), so the read side can use it.

`survival` and `evicted_layers` are item 4 of the task protocol: per layer and key/value head the share of the needle
a press kept, and the layers where no head kept any of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def occurrences(text: str, answer: str) -> list[tuple[int, int]]:
    """Every (start, end) character span of `answer` in `text` (overlapping ones included), in order."""
    spans, start = [], text.find(answer) if answer else -1
    while start >= 0:
        spans.append((start, start + len(answer)))
        start = text.find(answer, start + 1)
    return spans


def needle_tokens(tokenizer, text: str, start: int, context: str, answers: Sequence[str],
                  ids: Sequence[int]) -> np.ndarray:
    """Sorted token positions (int64) of `text` — tokenized without special tokens into `ids` — that overlap an
    occurrence of an answer in `context`, which starts at character `start` of `text`. Empty when the tokenizer
    cannot give offsets that reproduce `ids`, or no answer occurs."""
    spans = [(start + a, start + b) for answer in answers for a, b in occurrences(context, answer)]
    if not spans:
        return np.zeros(0, dtype=np.int64)
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):
        return np.zeros(0, dtype=np.int64)
    if list(encoded["input_ids"]) != list(ids):
        return np.zeros(0, dtype=np.int64)
    offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    hit = np.zeros(len(offsets), dtype=bool)
    for a, b in spans:
        hit |= (offsets[:, 0] < b) & (offsets[:, 1] > a)
    return np.flatnonzero(hit).astype(np.int64)


def survival(kept: np.ndarray, needle: np.ndarray, length: int) -> np.ndarray:
    """Per key/value head, the share of the needle's positions among `kept` (H_kv, m) context positions of a cache
    of `length` tokens: (H_kv,); NaN for every head when there is no needle."""
    if needle.size == 0:
        return np.full(kept.shape[0], np.nan)
    mask = np.zeros((kept.shape[0], length), dtype=bool)
    np.put_along_axis(mask, kept, True, axis=1)
    return mask[:, needle].mean(axis=1)


def evicted_layers(shares: np.ndarray) -> list[int]:
    """The layers (0-based) where every key/value head kept none of the needle: `shares` (layers, H_kv) from
    `survival`; layers with an undefined share are never listed."""
    return [int(layer) for layer in np.flatnonzero((np.nan_to_num(shares, nan=1.0) == 0).all(axis=1))]
