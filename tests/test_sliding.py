"""`spectra.sliding`: each layer's window read off a config as transformers attends it, and the band mask against
a loop over positions."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig

from spectra import sliding
from spectra.errors import SpectraError


def test_gemma3_layers_are_local_but_every_sixth() -> None:
    config = Gemma3TextConfig(num_hidden_layers=12, sliding_window=512)
    assert sliding.windows(config) == [None if (layer + 1) % 6 == 0 else 512 for layer in range(12)]


def test_a_model_without_windows_is_global_and_mistral_is_local_everywhere() -> None:
    assert sliding.windows(LlamaConfig(num_hidden_layers=3)) == [None] * 3
    assert sliding.windows(MistralConfig(num_hidden_layers=2, sliding_window=64)) == [64, 64]


def test_a_layer_kind_spectra_does_not_attend_is_one_line() -> None:
    config = Gemma3TextConfig(num_hidden_layers=2, sliding_window=8)
    config.layer_types = ["chunked_attention", "full_attention"]
    with pytest.raises(SpectraError, match="chunked_attention"):
        sliding.windows(config)


def test_the_band_against_a_loop() -> None:
    queries, keys = torch.tensor([5, 9, 12]), torch.tensor([0, 3, 5, 6, 9, 10, 12])
    for window in (None, 1, 4, 7):
        expected = [[k <= q and (window is None or q - k < window) for k in keys.tolist()] for q in queries.tolist()]
        assert sliding.band(queries, keys, window).tolist() == expected


def test_a_local_layer_keeps_its_last_window_minus_one_tokens() -> None:
    assert sliding.kept(1000, 512) == 511 and sliding.kept(100, 512) == 100


def test_a_config_json_read_as_a_dict_gives_the_same_windows() -> None:
    """The checks before a model loads read config.json: the same windows as its config object, and `windowed`
    (None where the layer kinds are refused once it loads)."""
    config = Gemma3TextConfig(num_hidden_layers=12, sliding_window=512)
    assert sliding.windows(config.to_dict()) == sliding.windows(config)
    assert sliding.windowed(config.to_dict()) is True and sliding.windowed(LlamaConfig().to_dict()) is False
    assert sliding.windows({"text_config": {"num_hidden_layers": 2, "sliding_window": 4}}) == [4, 4]
    assert sliding.windowed({"num_hidden_layers": 1, "layer_types": ["chunked_attention"]}) is None
