"""kvpress's CompressionRatioDecodingPress, one cache at a time: its size at a compression is max(1, ⌊S·(1 − r)⌋) of
the S tokens seen so far (numpy), it is due as DecodingPress's hook decides with that size, and a stream of decoding
steps compressed by it keeps, step for step, what a numpy simulation of kvpress's forward hook keeps (knorm: the
smallest key norms among the rows still cached, in torch.topk's order); bad input is refused. (Whole answers and
teacher-forced logits against a dense forward that hides the evicted rows: tests/kv/test_generation.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv import generation
from spectra.kv.presses import REGISTRY, run_presses
from spectra.kv.presses.decoding import DecodingPress
from spectra.kv.presses.ratiodecoding import CompressionRatioDecodingPress
from spectra.registry import PRESSES, press_names

from .conftest import DIM, HEADS, KV_HEADS, make_prefill


def test_its_size_is_the_ratios_share_of_the_tokens_seen() -> None:
    press = REGISTRY["compression_ratio_decoding(knorm)"]
    seen = np.arange(1, 3000)
    for ratio in (0.0, 0.1, 0.25, 0.5, 0.7, 0.9, 0.99):
        want = np.maximum(1, np.floor(seen * (1 - ratio)).astype(np.int64))
        got = np.array([press.size(17, int(s), ratio) for s in seen])
        # float products that land within 1e-9 of an integer truncate as Python's int(S·(1 − r)) does, not ⌊·⌋
        exact = np.abs(seen * (1 - ratio) - np.round(seen * (1 - ratio))) > 1e-9
        np.testing.assert_array_equal(got[exact], want[exact])
        assert all(got[i] == max(1, int(int(s) * (1 - ratio))) for i, s in enumerate(seen) if not exact[i])
    assert REGISTRY["decoding(knorm)"].size(17, 1000, 0.5) == 17  # DecodingPress: its fixed target


def test_a_run_builds_it_with_its_interval_and_the_registry_states_its_facts() -> None:
    name = "compression_ratio_decoding(tova)"
    built = run_presses([name], compression_interval=9)[name]
    assert isinstance(built, CompressionRatioDecodingPress) and isinstance(built, DecodingPress)
    assert built.interval == 9 and built.label == "compression_ratio_decoding(tova)" and built.wrapped.name == "tova"
    assert REGISTRY["compression_ratio_decoding(tova)"].interval == 512
    assert type(built.fresh()) is CompressionRatioDecodingPress and built.fresh().interval == 9
    facts = dict(PRESSES.facts("compression_ratio_decoding(knorm)"))
    assert facts["peer"] == "CompressionRatioDecodingPress" and facts["decodes"] and facts["interval"] == 512
    assert built.target(256, 0.5) == 128  # the tables' kept share: the size at the context


def simulate(keys: np.ndarray, context: int, ratio: float, interval: int) -> list[list[np.ndarray]]:
    """kvpress's CompressionRatioDecodingPress over knorm, written here: the cache holds the first `context` keys
    (one key/value head per row of `keys` (H_kv, N, d)); each step appends the next key, counts, and when the count
    reaches `interval` or the size is ≤ 1 (a one-token step of at least `size` tokens) keeps the size = max(1,
    int(S · (1 − ratio))) rows of smallest norm (S the tokens seen), ordered by rising norm. Returns, per step, the
    positions cached per head."""
    cached = [np.arange(context) for _ in keys]
    count, states = 0, []
    for position in range(context, keys.shape[1]):
        cached = [np.r_[rows, position] for rows in cached]
        count += 1
        size = max(1, int((position + 1) * (1 - ratio)))
        if count >= interval or 1 >= size:
            for head, rows in enumerate(cached):
                if len(rows) > size:
                    norms = np.linalg.norm(keys[head, rows], axis=-1)
                    cached[head] = rows[np.argsort(norms, kind="stable")[:size]]
            count = 0
        states.append([rows.copy() for rows in cached])
    return states


@pytest.mark.parametrize("ratio,interval", [(0.5, 4), (0.3, 7), (0.75, 1)])
def test_a_stream_of_steps_keeps_what_kvpress_keeps(ratio, interval) -> None:
    context, total = 40, 90
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((KV_HEADS, total, DIM)) * rng.uniform(0.5, 2.0, (KV_HEADS, total, 1))
    values = rng.standard_normal((KV_HEADS, total, DIM - 1))
    press = REGISTRY["compression_ratio_decoding(knorm)"].for_run(compression_interval=interval)
    recompression = generation.Recompression(press, press.target(context, ratio), ratio=ratio)
    positions = torch.arange(total, dtype=torch.float64)[None, :, None].expand(KV_HEADS, total, 1)
    # each cached row carries its position as the value's last channel, so the rows kept can be read back
    stored = torch.cat([torch.from_numpy(values), positions], dim=-1)
    cache = generation.Buffers([torch.zeros(KV_HEADS, total, DIM, dtype=torch.float64)],
                               [torch.zeros(KV_HEADS, total, DIM, dtype=torch.float64)], [0])
    cache.extend(0, torch.from_numpy(keys[:, :context]), stored[:, :context])
    q = torch.zeros(HEADS, 1, DIM, dtype=torch.float64)
    for step, want in enumerate(simulate(keys, context, ratio, interval)):
        position = context + step
        cache.extend(0, torch.from_numpy(keys[:, position:position + 1]), stored[:, position:position + 1])
        recompression.seen = position + 1
        recompression.after(0, cache, q, DIM ** -0.5)
        _, rows = cache.rows(0)
        got = rows[..., -1].long().numpy()
        for head in range(KV_HEADS):
            np.testing.assert_array_equal(got[head], want[head], err_msg=f"step {step}, head {head}")
    assert recompression.compressions >= 3
    assert cache.lengths[0] >= int(total * (1 - ratio)) - 1 > press.target(context, ratio)  # the cache grew


def test_a_pass_of_at_least_its_size_compresses() -> None:
    """The question's pass of n tokens compresses when n ≥ the size at its last position, as kvpress's hook does."""
    press = REGISTRY["compression_ratio_decoding(knorm)"]
    assert press.due(1, 10, press.size(0, 20, 0.5)) and not press.due(1, 9, press.size(0, 22, 0.5))


def test_bad_input_is_refused() -> None:
    with pytest.raises(TypeError, match="compression_ratio_decoding wraps a decodable scorer press, not snapkv"):
        REGISTRY["compression_ratio_decoding"].bind(REGISTRY["snapkv"])
    for name, message in (
            ("compression_ratio_decoding(snapkv)", ("compression_ratio_decoding wraps a decodable press, and "
                                                    "'snapkv' is not one; decodables: streaming, knorm, tova$")),
            ("compression_ratio_decoding", "takes an argument: compression_ratio_decoding\\(<decodable>\\)$"),
            ("compression_ratio_decoding(decoding(knorm))", "'decoding\\(knorm\\)' is not one")):
        with pytest.raises(SpectraError, match=message):
            press_names([name])
    press = REGISTRY["compression_ratio_decoding(knorm)"]
    with pytest.raises(ValueError, match="sizes its cache from the tokens seen so far, and none were given"):
        press.size(10, 0, 0.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\), not 1.0"):
        press.size(10, 100, 1.0)
    with pytest.raises(ValueError, match="compression_ratio_decoding needs a scorer press"):
        REGISTRY["compression_ratio_decoding"].wrapped  # noqa: B018
    prefill, _ = make_prefill()
    np.testing.assert_array_equal(press.compress(prefill, 0.5).kept.numpy(), np.tile(np.arange(100), (2, 1)))
