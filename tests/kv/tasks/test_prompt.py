"""kvpress's prompt: the context in the chat template (or after BOS), the question with the template's suffix and
the answer prefix, each tokenized alone; checked against the template rendered and cut here independently."""

from __future__ import annotations

from spectra.kv.tasks.prompt import chat_prompt, prompt_ids, prompt_length

CONTEXT, QUESTION, PREFIX = "the attention matrix #### of keys", "What is low rank? ", "Answer:"


def test_with_a_chat_template(chat_tokenizer) -> None:
    rendered = chat_tokenizer.apply_chat_template([{"role": "user", "content": CONTEXT}], add_generation_prompt=True,
                                                  tokenize=False)
    cut = rendered.index(CONTEXT) + len(CONTEXT)
    prompt = chat_prompt(chat_tokenizer, CONTEXT, QUESTION, PREFIX)
    assert prompt.context == rendered[:cut]
    assert prompt.question == QUESTION + "<|im_end|>\n<|im_start|>assistant\n" + PREFIX
    context_ids, question_ids = prompt_ids(chat_tokenizer, CONTEXT, QUESTION, PREFIX)
    assert context_ids == chat_tokenizer(rendered[:cut], add_special_tokens=False)["input_ids"]
    assert question_ids == chat_tokenizer(prompt.question, add_special_tokens=False)["input_ids"]
    assert prompt_length(chat_tokenizer, CONTEXT, QUESTION, PREFIX, 7) == len(context_ids) + len(question_ids) + 7


def test_without_a_chat_template_bos_opens_and_a_newline_closes(tokenizer) -> None:
    assert tokenizer.chat_template is None
    prompt = chat_prompt(tokenizer, CONTEXT, QUESTION, PREFIX)
    assert (prompt.context, prompt.question) == ("<s>" + CONTEXT, QUESTION + "\n" + PREFIX)
    context_ids, _ = prompt_ids(tokenizer, CONTEXT, QUESTION, PREFIX)
    assert context_ids[0] == tokenizer.bos_token_id and context_ids.count(tokenizer.bos_token_id) == 1
