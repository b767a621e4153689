"""A task record's prompt as kvpress's `kv-press-text-generation` pipeline builds it, and its length in tokens.

kvpress (pipeline.py, `preprocess`) wraps the context in the model's chat template as the user's message and cuts
the templated text where the context ends: the first part (template opening + context) is what gets prefilled and
compressed, the rest (`question_suffix`: end of the user turn, opening of the assistant's) is appended to the
question, then the answer prefix. A tokenizer without a chat template gets its BOS token before the context and a
newline after the question. Both parts are tokenized apart, without special tokens. The task protocol prefills
exactly these ids, and `spectra tasks` fits its lengths with them, so a record's `length` is what the model sees.

Torch-free: works on any tokenizer with `encode` and `apply_chat_template` (transformers' fast tokenizers).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """The two texts kvpress tokenizes: `context` (chat template opening + context) and `question` (question +
    the template's suffix + answer prefix)."""

    context: str
    question: str


def chat_prompt(tokenizer, context: str, question: str, answer_prefix: str) -> Prompt:
    """The prompt texts of kvpress's pipeline for one context and one question (enable_thinking off)."""
    if getattr(tokenizer, "chat_template", None) is None:
        bos = getattr(tokenizer, "bos_token", None) or ""
        return Prompt(bos + context, question + "\n" + answer_prefix)
    separator = "#" * (len(context) + 10)  # longer than any run of # in the context: the cut is unambiguous
    templated = tokenizer.apply_chat_template([{"role": "user", "content": context + separator}],
                                              add_generation_prompt=True, tokenize=False, enable_thinking=False)
    opening, suffix = templated.split(separator)
    return Prompt(opening, question + suffix + answer_prefix)


def prompt_ids(tokenizer, context: str, question: str, answer_prefix: str) -> tuple[list[int], list[int]]:
    """(context ids, question ids) as kvpress's pipeline tokenizes them: each part alone, no special tokens."""
    prompt = chat_prompt(tokenizer, context, question, answer_prefix)
    return (tokenizer.encode(prompt.context, add_special_tokens=False),
            tokenizer.encode(prompt.question, add_special_tokens=False))


def prompt_length(tokenizer, context: str, question: str, answer_prefix: str, max_new_tokens: int) -> int:
    """Tokens the example occupies: context and question ids plus the tokens it may generate, as RULER counts a
    length (input + tokens_to_generate ≤ max_seq_length), with kvpress's chat-templated prompt as the input."""
    context_ids, question_ids = prompt_ids(tokenizer, context, question, answer_prefix)
    return len(context_ids) + len(question_ids) + max_new_tokens
