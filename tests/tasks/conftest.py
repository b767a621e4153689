"""Tokenizers for the task tests: the tiny Llama's (no chat template: kvpress puts BOS before the context) and the
same with a chat template, saved with a tiny decoder of 4096 positions so task lengths fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny

#: a ChatML-like template with a system turn, as SmolLM2's
CHAT = ("{% for message in messages %}<|im_start|>system\nYou help.<|im_end|>\n<|im_start|>{{ message['role'] }}\n"
        "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}")


@pytest.fixture(scope="session")
def long_decoder(tmp_path_factory) -> Path:
    return tiny.save_decoder(tmp_path_factory.mktemp("models") / "tiny-llama-4096", "llama", positions=4096)


@pytest.fixture(scope="session")
def tokenizer(long_decoder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(long_decoder)


@pytest.fixture(scope="session")
def chat_tokenizer(long_decoder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(long_decoder)
    tokenizer.chat_template = CHAT
    return tokenizer


@pytest.fixture(scope="session")
def chat_decoder(long_decoder, chat_tokenizer, tmp_path_factory) -> Path:
    """The tiny decoder's directory with the chat template saved in its tokenizer."""
    import shutil

    path = tmp_path_factory.mktemp("models") / "tiny-chat"
    shutil.copytree(long_decoder, path, dirs_exist_ok=True)
    chat_tokenizer.save_pretrained(path)
    return path
