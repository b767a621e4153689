"""The task protocol guards itself: its full cache must answer as transformers' own `model.generate` does.

spectra answers from a cache of its own making — an exact prefill through its attention function, a compressed cache
laid out per layer, greedy decoding by substituted attention (`kv.prefill`, `kv.batching`). A model whose attention
differs from what that engine assumes (a sliding window it does not apply, a scaling, a cache layout) would then
answer wrongly *for every press, the full cache included*, and every table would still look like a result. So, before
the presses run, the first example's full-cache answer is compared token for token with `model.generate`'s greedy
answer to the same ids, for any model: a mismatch stops the run with one line naming the architecture.

Floating point may legitimately part two greedy decodings where the top two logits tie: a step where they part is
accepted only when `generate`'s own top two logits there lie within `TIE` of each other (relative to the logits' scale).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import SpectraError
from . import batching
from .cell import FULL, Cell
from .generation import Request
from .presses import Prefill

#: the relative gap between the two best logits below which two greedy decodings may part by rounding alone
TIE = 1e-4


def generated(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """`model.generate`'s greedy `steps` tokens after `ids` (n,) — no stop token ends it early (spectra's own answer
    fixes the length) — and its logits at each step."""
    config = model.generation_config.__class__.from_dict(model.generation_config.to_dict())
    config.eos_token_id, config.pad_token_id, config.do_sample = None, 0, False
    for unset in ("temperature", "top_p", "top_k"):
        setattr(config, unset, None)
    ids = ids.reshape(1, -1)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, max_new_tokens=steps,
                             min_new_tokens=0, output_scores=True, return_dict_in_generate=True)
    return out.sequences[0, ids.shape[-1]:].tolist(), [score[0] for score in out.scores]


def parted(answer: Sequence[int], reference: Sequence[int], logits: Sequence[torch.Tensor]) -> int | None:
    """The first step where `answer` and `reference` differ other than by a tie of `reference`'s logits there, or
    None when they agree (ties allowed)."""
    for step, (mine, theirs) in enumerate(zip(answer, reference)):
        if mine == theirs:
            continue
        scores = logits[step].float()
        best = float(scores.max())
        if best - float(scores[mine]) <= TIE * max(1.0, abs(best)):
            return None  # a tie: from here on the two decodings follow different, equally greedy paths
        return step
    return None


def check(model: torch.nn.Module, context_ids: torch.Tensor, question_ids: torch.Tensor, answer: Sequence[int]
          ) -> None:
    """Stop with one line unless the full cache's greedy `answer` (token ids, as spectra decoded them, a stop token
    kept) to the context and question equals `model.generate`'s, token for token (see the module docstring)."""
    if not answer:
        return
    ids = torch.cat([context_ids.reshape(-1), question_ids.reshape(-1).to(context_ids.device)])
    reference, logits = generated(model, ids, len(answer))
    step = parted(answer, reference, logits)
    if step is None:
        return
    architecture = ", ".join(getattr(model.config, "architectures", None) or [type(model).__name__])
    raise SpectraError(
        f"spectra's full cache does not answer as model.generate on this model ({architecture}): on the first "
        f"example they part at token {step + 1} of {len(answer)} ({answer[step]} against {reference[step]}), so "
        "every score of this run would be wrong; the task protocol does not support this architecture yet "
        "(please report it)")


def first_example(model: torch.nn.Module, layers: int, prefills: Sequence[Prefill], context_ids: torch.Tensor,
                  request: Request) -> None:
    """`check` on an example: its full cache built from its `prefills` (every layer's, of `context_ids`) and decoded
    as the probe decodes every cell (`batching.greedy_batch`), its answer to `request` (whose question starts right
    after the context) compared with `model.generate`'s."""
    cell = Cell(FULL, 0.0, None, context_ids.shape[-1], 0, request.index)
    for prefill in prefills:
        cell.compress(prefill)
    if request.start != cell.start:
        raise ValueError(f"the question starts at {request.start}, not after the {cell.start} context tokens")
    batch = batching.CacheBatch.of([cell.parts], list(prefills), request.question.shape[-1] + request.max_new_tokens)
    decoded = batching.greedy_batch(model, layers, batch, [request])[0]
    check(model, context_ids, request.question, decoded.ids)
