"""`finch` (FINCH, Corallo & Papotti 2024, TACL, doi:10.1162/tacl_a_00716; kvpress 0.5.5's FinchPress): keep the
context tokens the question attends to, then re-rotate the kept keys to contiguous positions.

FINCH is prompt-guided: the prompt's question sits at the end of the context that is compressed, and its tokens
play SnapKV's observation window. With w the question's tokens, key j < L − w scores the attention the w question
queries pay it (each row the causal softmax over all L keys), each row i first multiplied by L − w + i — roughly the
number of keys that row's softmax shares its mass among (FINCH's normalization) — then averaged over the window and
over each key/value group; the w question tokens are scored the tensor's max + 1 (always kept). The top n_kept =
max(1, int(L·(1 − r))) of the L tokens are kept per key/value head (or, with `chunk`, n_kept of each chunk of that
many tokens, FINCH's chunked prefill), and, sorted by position, the j-th kept key is turned by RoPE to position j
(`rerotation.rerotated_keys`): the question's answer is then decoded at positions m, m + 1, … (`Compressed.start`).

kvpress finds the window at run time: the prompt is context + a delimiter token + question (its evaluation appends
`<|finch_sep|>` and the question to the context and passes an empty question), and a hook on the embeddings removes
the delimiter and sets window_size to the tokens after it. Here the window is the question's own tokens
(`Prefill.question_tokens`: the task study with `--query-aware` compresses the question with the context, and counts
the question's tokens tokenized alone, as kvpress's delimiter separates them). Where the context holds no question (the
NLL study, a query-agnostic task) the window is the last WINDOW = 64 context tokens — kvpress's FinchPress with its
delimiter 64 tokens before the end (window_size 64). Defaults as kvpress's: chunk_length None (the whole context at
once), normalize_scores and rerotate_keys on. A question longer than the prefill's WINDOW queries is refused
(`reads_question`): by the task study as it reads the records with the tokenizer, before the model's weights load.
"""

from __future__ import annotations

import torch

from .base import Compressed, Prefill, Press, n_kept, register
from .eviction import protect_last
from .rerotation import rerotated_keys

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 11


def finch_window(prefill: Prefill) -> int:
    """The tokens FINCH's window holds: the question's (`Prefill.question_tokens`), else the last `Finch.window`."""
    window = prefill.question_tokens or Finch.window
    if window > prefill.q.shape[1]:
        raise ValueError(f"finch reads the question's {window} tokens as its window, but the prefill kept the last "
                         f"{prefill.q.shape[1]} queries: a question of at most {prefill.q.shape[1]} tokens")
    if window >= prefill.length:
        raise ValueError(f"finch needs more context tokens than its window of {window}, got {prefill.length}")
    return window


def finch_scores(prefill: Prefill, window: int, normalize: bool = True) -> torch.Tensor:
    """(H_kv, L) FINCH's scores with a window of the last `window` context tokens: their attention rows (over all L
    keys, causal) to the first L − window keys, row i times L − window + i (`normalize`), averaged over the rows and
    over each key/value group; the window's tokens scored max + 1."""
    length = prefill.length
    rows = prefill.window[:, -window:, : length - window]  # (H, w, L − w)
    if normalize:
        rows = rows * torch.arange(length - window, length, device=rows.device)[None, :, None]
    return protect_last(prefill.group_mean(rows.mean(dim=1)), window)


def finch_kept(scores: torch.Tensor, ratio: float, chunk: int | None = None) -> torch.Tensor:
    """(H_kv, m) the kept positions, ascending: the top n_kept(L, ratio) scores, or n_kept of each `chunk` tokens."""
    if chunk is None:
        kept = torch.topk(scores, n_kept(scores.shape[-1], ratio), dim=-1).indices
    else:
        kept = torch.cat([start + torch.topk(part, n_kept(part.shape[-1], ratio), dim=-1).indices
                          for start, part in zip(range(0, scores.shape[-1], chunk), scores.split(chunk, dim=-1))],
                         dim=-1)
    return kept.sort(dim=-1).values


@register
class Finch(Press):
    """FINCH: the tokens the question's queries attend to (normalized SnapKV scores over a window of the question's
    tokens), kept keys re-rotated to positions 0 … m − 1 (see the module docstring). `chunk`: score and keep chunk
    by chunk (kvpress's chunk_length; None, its default: the whole context)."""

    name, summary = "finch", "the keys the question attends to, re-rotated to contiguous positions"
    peer = "FinchPress"
    window = 64  # without a question in the context: kvpress's FinchPress with window_size 64
    windowed, needs_rope, reads_question, renumbers = True, True, True, True

    def __init__(self, chunk: int | None = None) -> None:
        self.chunk = chunk

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        window = finch_window(prefill)
        if self.chunk is not None and not self.chunk > window / (1 - ratio):
            raise ValueError(f"finch's chunks of {self.chunk} tokens must exceed its window over the kept share, "
                             f"{window} / (1 − {ratio}) (kvpress asserts it)")
        kept = finch_kept(finch_scores(prefill, window), ratio, self.chunk)
        return Compressed(kept, 1.0 - kept.shape[-1] / prefill.length, key=rerotated_keys(prefill, kept),
                          start=kept.shape[-1])

    def fresh(self) -> Finch:
        return type(self)(self.chunk)
