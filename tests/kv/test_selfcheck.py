"""The task protocol's guard (`kv.selfcheck`): the full cache's answer on the first example against
`model.generate`'s, on a tiny Llama and a tiny Gemma 3 (sliding-window layers), a wrong engine caught in one line
naming the architecture, a rounding tie let through."""

from __future__ import annotations

import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv import prefill, selfcheck
from spectra.kv.generation import Request

import tiny


def _ids(seed: int, context: int, question: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 128, (context,), generator=generator), torch.randint(3, 128, (question,),
                                                                                 generator=generator)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_full_cache_of_a_sliding_window_model_answers_as_generate(seed: int) -> None:
    model = tiny.gemma3(window=8, dtype=torch.float64)
    context, question = _ids(seed, 40, 5)
    prefills = prefill.exact(model, 3, context, 0, 0, ())
    selfcheck.first_example(model, 3, prefills, context, Request(question, 40, 12, set(), 0))  # raises if they part


def test_a_prefill_that_ignores_the_window_is_caught_in_one_line(monkeypatch) -> None:
    model = tiny.gemma3(window=8, dtype=torch.float64)
    context, question = _ids(0, 40, 5)
    monkeypatch.setattr(prefill.sliding, "of_model", lambda model: [])  # every layer attended globally
    prefills = prefill.exact(model, 3, context, 0, 0, ())
    with pytest.raises(SpectraError, match=r"Gemma3ForCausalLM") as error:
        selfcheck.first_example(model, 3, prefills, context, Request(question, 40, 12, set(), 0))
    assert "\n" not in str(error.value)


def test_a_tie_of_generate_s_logits_is_not_a_parting() -> None:
    logits = [torch.tensor([0.0, 5.0, 5.0 - 1e-6]), torch.tensor([1.0, 0.0, 0.0])]
    assert selfcheck.parted([2, 0], [1, 0], logits) is None
    assert selfcheck.parted([1, 2], [1, 0], logits) == 1
    assert selfcheck.parted([0, 0], [1, 0], logits) == 0


def test_decoding_without_the_window_would_be_caught(monkeypatch) -> None:
    """The local layers' cache holds exactly the first question token's window; later tokens must see less of it."""
    model = tiny.gemma3(window=8, dtype=torch.float64)
    context, question = _ids(0, 40, 5)
    prefills = prefill.exact(model, 3, context, 0, 0, ())
    monkeypatch.setattr(selfcheck.batching.CacheBatch, "local", lambda self, layer: False)
    with pytest.raises(SpectraError, match="part at token"):
        selfcheck.first_example(model, 3, prefills, context, Request(question, 40, 12, set(), 0))


def test_the_question_starts_after_the_context() -> None:
    """The request is decoded after the whole context: a question placed elsewhere is a caller's slip, refused."""
    model = tiny.gemma3(window=8, dtype=torch.float64)
    context, question = _ids(0, 40, 5)
    prefills = prefill.exact(model, 3, context, 0, 0, ())
    with pytest.raises(ValueError, match="the question starts at 39, not after the 40 context tokens"):
        selfcheck.first_example(model, 3, prefills, context, Request(question, 39, 12, set(), 0))
