"""Task files for the task protocol's tests: kvpress's records over the tiny models' vocabulary, a needle sentence
placed at evenly spread depths of a haystack of tiny.WORDS."""

from __future__ import annotations

import json
import random
from pathlib import Path

import tiny

NEEDLE = "the key is {value} rank"
#: answers made of letters the tiny tokenizer knows but never a word of tiny.WORDS: they occur in the needle only
VALUES = ("tarnel", "mosit", "pelorn", "dursak", "vingor", "coltem")


def records(count: int = 4, words: int = 120, seed: int = 0, max_new_tokens: int = 5, task: str = "passkey",
            length: int | None = 160) -> list[dict]:
    """`count` records whose answer (one of VALUES) sits in a needle sentence at depth i / (count − 1)."""
    rng = random.Random(seed)
    found = []
    for i in range(count):
        hay = [rng.choice(tiny.WORDS) for _ in range(words)]
        depth = i / max(count - 1, 1)
        value = VALUES[i % len(VALUES)]
        hay.insert(int(round(len(hay) * depth)), NEEDLE.format(value=value))
        found.append({"context": " ".join(hay), "question": "what is the key? ", "answer_prefix": "the key is",
                      "answers": [value], "max_new_tokens": max_new_tokens, "task": task, "length": length,
                      "depth": depth})
    return found


def many_questions(rows: list[dict]) -> list[dict]:
    """`records`' rows, each asking two questions of its context (kvpress's `questions=[…]`): the first about its
    needle, the second about a second needle (the next value of VALUES) inserted at the start of its haystack."""
    found = []
    for i, row in enumerate(rows):
        other = VALUES[(i + 1) % len(VALUES)]
        door = f"the door is {other} rank"
        asked = {key: value for key, value in row.items() if key not in ("question", "answers")}
        found.append({**asked, "context": door + " " + row["context"],
                      "questions": [row["question"], "what is the door? "], "answers": [row["answers"], [other]]})
    return found


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


#: a ChatML-like template with a system turn, as SmolLM2's
CHAT = ("{% for message in messages %}<|im_start|>system\nYou help.<|im_end|>\n<|im_start|>{{ message['role'] }}\n"
        "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}")


def save_chat_decoder(path: Path) -> Path:
    """A tiny Llama (2 layers, 4 heads over 2 key/value heads, 4096 positions) whose tokenizer has `CHAT`."""
    from transformers import AutoTokenizer

    tiny.save_decoder(path, "llama", positions=4096)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT
    tokenizer.save_pretrained(path)
    return path
