"""passkey: the landmark-attention recipe (the key line between garbage, at its depth); no RULER prompt to split."""

from __future__ import annotations

import pytest

from spectra.errors import SpectraError
from spectra.registry import TASKS


def test_passkey_follows_the_landmark_recipe(build) -> None:
    example = build("passkey", 1000, 0.25)
    key = example.answers[0]
    assert f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n" in example.context
    assert (example.asked[0].text, example.answer_prefix) == ("What is the pass key? ", "The pass key is")
    assert not example.many and example.asked[0].answers == example.answers
    assert 1 <= int(key) <= 50000 and TASKS["passkey"].max_new_tokens == 10
    # the task line, the garbage around the key line (1000 characters) and the key line, each ending in a newline
    assert len(example.context) == len(example.context.split("\n")[0]) + 1000 + 48 + len(key) * 2 + 4


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_the_key_sits_at_its_depth(depth: float, build) -> None:
    example = build("passkey", 4000, depth)
    assert abs(example.context.index("The pass key is") / len(example.context) - depth) < 0.06
    assert example.depth == depth


def test_ruler_writes_no_passkey() -> None:
    with pytest.raises(SpectraError, match="RULER writes no passkey task"):
        TASKS["passkey"].split("What is the pass key? The pass key is")
