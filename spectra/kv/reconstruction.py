"""KVzip's context-reconstruction pass (Kim et al. 2025, arXiv:2505.23416): how much each cached context pair matters
to a model asked to repeat the context, scored once per example for every layer.

After the exact prefill of the L context tokens, the model reads a prompt asking it to repeat the context, followed by
the context itself, attending to the prefilled cache (and causally to the prompt). A cached pair the repetition
attends to strongly is one the context cannot be rebuilt without. kvpress 0.5.5's `KVzipPress` is followed to the
letter, with its defaults:

- the context after the chat template's opening (`Repetition.prefix` tokens: the opening of the tokenizer's chat
  template, counted whatever the context is) is cut into chunks of `CHUNK` tokens; chunk 0 is repeated after
  "\\n\\nRepeat the previous context exactly.", chunk i > 0 after "\\n\\nRepeat the part of the previous context
  exactly, starting with" and the last `OVERLAP` tokens of chunk i − 1, each prompt followed by the template's
  assistant opening (`suffix`) and the chunk. Every chunk is a pass of its own over the prefilled cache, at positions
  L, L + 1, … (the cache is brought back to the context after each pass);
- in every layer, the repeat's post-RoPE queries are scored against a subset of keys only — the first
  min(`SINKS`, chunk start) cached keys, the chunk's own cached keys and the repeat's keys (causally) —
  softmax(q kᵀ/√d) over that subset; a cached pair's score is the largest weight any query of its key/value
  head's group gives it;
- the first `SINKS` positions are then raised above every score of every layer (max + 1): attention sinks are never
  evicted. Positions of the template's opening that are not sinks keep the score 0.

The pass's own forward attends exactly, by SDPA over the whole cache and the repeat (`repeat_attention`, never an
n × (L + n) matrix: at L = 8192 and the 2048-token chunk, the scores of a layer's subset, H × n × (4 + 2048 + n)
floats, about 0.3 GB for SmolLM2, are what the pass holds); a sliding-window layer (Gemma 3's local layers,
`spectra.sliding`) attends within its window, as the model does, so the later layers' queries are the model's. Its
result, (layers, H_kv, L), goes to every layer's `Prefill.read("reconstruction")`; the `kvzip` press ranks it across
layers (the global ones on a model with local layers, which keep their windows). kvpress's KVzip+ normalisation (by ‖h‖ and
‖W_O v‖) is not computed here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import capture, sliding
from ..capture import Captured

#: kvpress's n_sink: the first cached positions each layer's score subset includes and no ratio evicts
SINKS = 4
#: kvpress's chunk_size: context tokens reconstructed per pass
CHUNK = 2048
#: kvpress's prev_postfix_size: the previous chunk's last tokens quoted in a later chunk's prompt
OVERLAP = 8
#: kvpress's prompts for the first chunk and for each later one
FIRST, LATER = ("\n\nRepeat the previous context exactly.",
                "\n\nRepeat the part of the previous context exactly, starting with")


def _ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)


@dataclass(frozen=True, eq=False)
class Repetition:
    """The token pieces of kvpress's reconstruction prompts for one tokenizer: `prefix`, the tokens of the chat
    template's opening (not reconstructed), `suffix` (the template's end of the user turn and assistant opening, or
    a newline without a template), `first` and `later` (the prompts' ids)."""

    prefix: int
    suffix: torch.Tensor
    first: torch.Tensor
    later: torch.Tensor

    @classmethod
    def of(cls, tokenizer) -> Repetition:
        """The pieces as kvpress cuts them: a dummy user message whose end is marked, templated with the generation
        prompt (enable_thinking off), split at the mark."""
        if getattr(tokenizer, "chat_template", None) is None:
            prefix_text, suffix_text = "", "\n"
        else:
            dummy = "dummy context"
            separator = "\n" + "#" * len(dummy)
            templated = tokenizer.apply_chat_template([{"role": "user", "content": dummy + separator}],
                                                      add_generation_prompt=True, tokenize=False,
                                                      enable_thinking=False)
            opening, suffix_text = templated.split(separator)
            prefix_text = opening.split(dummy)[0]
        return cls(len(_ids(tokenizer, prefix_text)), _ids(tokenizer, suffix_text), _ids(tokenizer, FIRST),
                   _ids(tokenizer, LATER))

    def chunks(self, ids: torch.Tensor, chunk: int = CHUNK) -> list[tuple[int, int, torch.Tensor]]:
        """(start, stop, repeat ids) per chunk of the context `ids` (L,): the context positions start … stop − 1 it
        reconstructs and the prompt + suffix + chunk fed after the cache. An empty remainder reconstructs nothing."""
        found = []
        for start in range(self.prefix, ids.shape[-1], chunk):
            stop = min(start + chunk, ids.shape[-1])
            quoted = ids[start - min(OVERLAP, chunk):start]  # the previous chunk's last tokens
            prompt = self.first.to(ids.device) if start == self.prefix else torch.cat([self.later.to(ids.device),
                                                                                        quoted])
            found.append((start, stop, torch.cat([prompt, self.suffix.to(ids.device), ids[start:stop]])))
        return found


def chunk_scores(q: torch.Tensor, own: torch.Tensor, cached: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """(H_kv, stop − start): each cached key start … stop − 1's largest weight from the n repeat queries
    q (H, n, d) of its key/value head's group (`chunk_weights`, the largest over the group and the queries)."""
    return chunk_weights(q, own, cached, start, stop).amax(dim=(1, 2))


def chunk_weights(q: torch.Tensor, own: torch.Tensor, cached: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """(H_kv, G, n, stop − start): the weights the n repeat queries q (H, n, d) give the cached keys start … stop − 1,
    the softmax over the first min(SINKS, start) cached keys, those keys and the repeat's own keys `own`
    (H_kv, n, d) causally; `cached` (H_kv, L, d). In the queries' dtype, scaled by 1/√d."""
    heads, n, dim = q.shape
    kv_heads = cached.shape[0]
    sink = min(SINKS, start)
    keys = torch.cat([cached[:, :sink], cached[:, start:stop], own], dim=1)  # (H_kv, m, d)
    weights = torch.matmul(q.reshape(kv_heads, -1, dim), keys.transpose(-1, -2)).div_(math.sqrt(dim))
    weights = weights.view(kv_heads, heads // kv_heads, n, keys.shape[1])
    hidden = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    weights[..., -n:].masked_fill_(hidden, torch.finfo(weights.dtype).min)  # in place: a view of the own keys
    weights = torch.softmax(weights, dim=-1)
    return weights[..., sink:sink + stop - start]


def repeat_attention(q: torch.Tensor, cached_key: torch.Tensor, cached_value: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, scaling: float, window: int | None = None) -> torch.Tensor:
    """The repeat's attention output (1, H, n, d): its queries q over the whole prefilled cache `cached_key`,
    `cached_value` (H_kv, L, d) and causally over its own keys and values (1, H_kv, n, d), by the fused SDPA kernel
    with a boolean mask (as kvpress's pass attends, with its cache; no n × (L + n) scores held); on a sliding-window
    layer (`window` W) the query at L + i sees the keys at positions after L + i − W only (`sliding.band`)."""
    n, length = q.shape[-2], cached_key.shape[-2]
    if window is None:
        allowed = torch.ones(n, length + n, dtype=torch.bool, device=q.device)
        allowed[:, length:] = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    else:
        positions = torch.arange(length + n, device=q.device)
        allowed = sliding.band(positions[length:], positions, window)
    return torch.nn.functional.scaled_dot_product_attention(
        q, torch.cat([cached_key[None], key], dim=-2), torch.cat([cached_value[None], value], dim=-2),
        attn_mask=allowed, scale=scaling, enable_gqa=q.shape[-3] != key.shape[-3])


def scores(model: torch.nn.Module, layers: int, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
           ids: torch.Tensor, repetition: Repetition, index: int, chunk: int = CHUNK) -> torch.Tensor:
    """(layers, H_kv, L): every cached pair's reconstruction score (see the module docstring), given each layer's
    prefilled `keys` and `values` (H_kv, L, d, post-RoPE) of the context `ids` (L,); `index` is the example's global
    index (the captured records carry it)."""
    length = ids.shape[-1]
    found = keys[0].new_zeros(layers, keys[0].shape[0], length)
    windows = sliding.of_model(model) or [None] * layers
    for start, stop, repeat in repetition.chunks(ids, chunk):
        def substitute(captured: Captured, start: int = start, stop: int = stop) -> torch.Tensor:
            layer = captured.layer
            found[layer, :, start:stop] = chunk_scores(captured.q[0], captured.key[0], keys[layer], start, stop)
            return repeat_attention(captured.q, keys[layer], values[layer], captured.key, captured.value,
                                    captured.scaling, windows[layer])

        positions = torch.arange(length, length + repeat.shape[-1], device=ids.device)[None]
        capture.forward(model, layers, None, substitute, [index], input_ids=repeat[None], position_ids=positions,
                        use_cache=False, logits_to_keep=1)
    found[..., :SINKS] = found.amax() + 1.0
    return found
