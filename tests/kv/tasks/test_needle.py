"""The needle span against token counts of the text's prefixes (at word boundaries the tokens of a prefix are the
first tokens of the whole), the kept share per head against a set count, and the evicted layers."""

from __future__ import annotations

import numpy as np

from spectra.kv.tasks.needle import evicted_layers, needle_tokens, occurrences, survival
from spectra.kv.tasks.prompt import chat_prompt

CONTEXT = "the attention matrix of keys and values along the sequence keeps most of its spectrum and keys"


def test_occurrences_are_every_span() -> None:
    assert occurrences("aXbXXc", "X") == [(1, 2), (3, 4), (4, 5)]
    assert occurrences("aXXXb", "XX") == [(1, 3), (2, 4)]
    assert occurrences("abc", "") == [] and occurrences("abc", "d") == []


def test_the_needle_is_the_tokens_of_every_occurrence(chat_tokenizer) -> None:
    prompt = chat_prompt(chat_tokenizer, CONTEXT, "Which? ", "It is")
    start = len(prompt.context) - len(CONTEXT)
    assert prompt.context[start:] == CONTEXT
    ids = chat_tokenizer.encode(prompt.context, add_special_tokens=False)
    found = needle_tokens(chat_tokenizer, prompt.context, start, CONTEXT, ["keys", "spectrum"], ids)

    def count(end: int) -> int:
        return len(chat_tokenizer.encode(prompt.context[:end], add_special_tokens=False))

    want = set()
    for answer in ("keys", "spectrum"):
        for a, b in occurrences(CONTEXT, answer):
            want |= set(range(count(start + a), count(start + b)))
    assert found.tolist() == sorted(want) and len(want) >= 3
    assert needle_tokens(chat_tokenizer, prompt.context, start, CONTEXT, ["absent"], ids).size == 0
    assert needle_tokens(chat_tokenizer, prompt.context, start, CONTEXT, ["keys"], ids[1:]).size == 0, \
        "offsets that do not reproduce the ids give no needle"


def test_survival_and_evicted_layers() -> None:
    kept = np.array([[0, 2, 5, 7], [1, 2, 3, 4]])
    needle = np.array([2, 3, 7])
    np.testing.assert_allclose(survival(kept, needle, 8), [2 / 3, 2 / 3])
    assert np.isnan(survival(kept, np.zeros(0, np.int64), 8)).all() and survival(kept, needle, 8).shape == (2,)
    shares = np.array([[0.0, 0.0], [0.0, 0.5], [np.nan, np.nan], [0.0, 0.0]])
    assert evicted_layers(shares) == [0, 3]
