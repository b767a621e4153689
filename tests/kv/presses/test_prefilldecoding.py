"""kvpress's PrefillDecodingPress with one scorer in both roles: after the prefill it keeps the scorer's n_kept(L, r)
best context rows (knorm: numpy's smallest key norms; streaming: the sinks and the recent window) in torch.topk's
order, and while decoding it is decoding(…) at that size; with a per-head prefill press, TOVA's decoding compressions
read that order (numpy's kvpress TOVA); bad input is refused. (Whole answers against a dense forward that hides the
evicted rows: tests/kv/test_generation.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept, run_presses
from spectra.kv.presses.decoding import DecodingPress
from spectra.kv.presses.prefilldecoding import PrefillDecodingPress
from spectra.registry import PRESSES, press_names

from .conftest import DIM, HEADS, KV_HEADS, make_prefill


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_after_the_prefill_it_keeps_the_scorers_best_rows_in_topk_order(ratio) -> None:
    prefill, arrays = make_prefill()
    compressed = REGISTRY["prefill_decoding(knorm)"].compress(prefill, ratio)
    keep = max(1, int(100 * (1 - ratio)))
    norms = np.linalg.norm(arrays["k"], axis=-1)
    np.testing.assert_array_equal(compressed.kept.numpy(), np.argsort(norms, axis=-1, kind="stable")[:, :keep])
    assert compressed.saved == pytest.approx(1 - keep / 100)
    evicted = REGISTRY["knorm"].compress(prefill, ratio)  # the same rows as the press alone, there in position order
    np.testing.assert_array_equal(np.sort(compressed.kept.numpy(), axis=-1), evicted.kept.numpy())


def test_streaming_keeps_the_sinks_and_the_window() -> None:
    prefill, _ = make_prefill()
    kept = REGISTRY["prefill_decoding(streaming)"].compress(prefill, 0.5).kept.numpy()
    for head in kept:
        assert sorted(head.tolist()) == [0, 1, 2, 3, *range(54, 100)]
    scores = REGISTRY["streaming"].score(prefill, 0.5)
    np.testing.assert_array_equal(kept, torch.topk(scores, 50, dim=-1).indices.numpy())


def test_while_decoding_it_is_decoding_at_the_prefills_size() -> None:
    built = run_presses(["prefill_decoding(tova)"], compression_interval=5)["prefill_decoding(tova)"]
    assert isinstance(built, PrefillDecodingPress) and isinstance(built, DecodingPress) and built.interval == 5
    assert built.label == "prefill_decoding(tova)" and type(built.fresh()) is PrefillDecodingPress
    assert built.target(100, 0.75) == n_kept(100, 0.75) == 25 and built.size(25, 400, 0.75) == 25
    facts = dict(PRESSES.facts("prefill_decoding(knorm)"))
    assert facts["peer"] == "PrefillDecodingPress" and facts["decodes"] and facts["interval"] == 512


def test_bad_input_is_refused() -> None:
    with pytest.raises(TypeError, match="prefill_decoding wraps a decodable scorer press, not snapkv"):
        REGISTRY["prefill_decoding"].bind(REGISTRY["snapkv"])
    for name, message in (
            ("prefill_decoding(snapkv)", ("prefill_decoding wraps a decodable press, and 'snapkv' is not one; "
                                          "decodables: streaming, knorm, tova$")),
            ("prefill_decoding", "takes an argument: prefill_decoding\\(<decodable>\\) or "
                                 "prefill_decoding\\(<scorer>,<decodable>\\)$"),
            ("prefill_decoding(knorm,snapkv)", "takes a decodable press as argument 2, none that is fitted on "
                                               "calibration text, "
                                               "and 'snapkv' is not one; decodables: streaming, knorm, tova$"),
            ("prefill_decoding(loki,knorm)", "takes a scorer press as argument 1, none that is fitted on "
                                             "calibration text, and "
                                             "'loki' is not one"),
            ("prefill_decoding(think,knorm)", "'think' is not one"),
            ("prefill_decoding(snapkv,knorm,tova)", ("is written prefill_decoding\\(<decodable>\\) or "
                                                     "prefill_decoding\\(<scorer>,")),
            ("prefill_decoding(decoding(knorm))", "'decoding\\(knorm\\)' is not one")):
        with pytest.raises(SpectraError, match=message):
            press_names([name])
    prefill, _ = make_prefill()
    with pytest.raises(ValueError, match="prefill_decoding needs a scorer press"):
        REGISTRY["prefill_decoding"].compress(prefill, 0.5)


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_two_presses_evict_with_the_first_and_decode_with_the_second(ratio) -> None:
    """prefill_decoding(keydiff,knorm): keydiff's n_kept best rows after the prefill (numpy's cosine with the mean
    unit key), in torch.topk's order; knorm while decoding, at the same target."""
    prefill, arrays = make_prefill(length=120, seed=4)
    keys = arrays["k"]
    norms = np.linalg.norm(keys, axis=-1)
    anchor = (keys / norms[..., None]).mean(axis=1)
    scores = -np.einsum("hld,hd->hl", keys, anchor) / (norms * np.linalg.norm(anchor, axis=-1)[:, None])
    keep = max(1, int(120 * (1 - ratio)))
    press = run_presses(["prefill_decoding(keydiff,knorm)"], compression_interval=3)["prefill_decoding(keydiff,knorm)"]
    compressed = press.compress(prefill, ratio)
    np.testing.assert_array_equal(compressed.kept.numpy(), np.argsort(-scores, axis=-1, kind="stable")[:, :keep])
    assert press.wrapped.name == "knorm" and press.evicting.name == "keydiff" and press.interval == 3
    assert press.target(120, ratio) == keep and press.fresh().name == "prefill_decoding(keydiff,knorm)"
    key = torch.from_numpy(keys)  # while decoding: knorm's rows (the smallest key norms), as decoding(knorm) keeps
    rows = press.keep(0, prefill.q, key, key, prefill.scaling, 30)
    np.testing.assert_array_equal(np.sort(rows.numpy(), -1), np.sort(np.argsort(norms, axis=-1)[:, :30], -1))


def test_the_one_argument_form_is_unchanged_and_two_merge_their_facts() -> None:
    prefill, _ = make_prefill()
    one = REGISTRY["prefill_decoding(knorm)"].compress(prefill, 0.5)
    two = REGISTRY["prefill_decoding(knorm,knorm)"].compress(prefill, 0.5)
    assert torch.equal(one.kept, two.kept) and REGISTRY["prefill_decoding(knorm)"].prefilling is None
    facts = dict(PRESSES.facts("prefill_decoding(snapkv,knorm)"))
    assert facts["windowed"] and facts["window"] == 64 and facts["decodes"] and facts["peer"] == "PrefillDecodingPress"
    assert REGISTRY["prefill_decoding(snapkv,knorm)"].windowed and "several" not in facts


def tova_step(positions: np.ndarray, arrays: dict, q: np.ndarray, k: np.ndarray, target: int) -> np.ndarray:
    """numpy's kvpress TOVA compression of a cache whose rows hold context `positions` (H_kv, m) then one new token
    (its key k (H_kv, d), its query q (H, d)): the mean over all query heads of the query's softmax over row i, the new
    row kept, the best `target` − 1 others — the same row indices in every key/value head. Returns the context
    positions each key/value head keeps (H_kv, target − 1), sorted."""
    keys = np.concatenate([np.take_along_axis(arrays["k"], positions[..., None], axis=1), k[:, None]], axis=1)
    scores = np.einsum("hd,hjd->hj", q, np.repeat(keys, HEADS // KV_HEADS, axis=0)) * DIM ** -0.5
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    mean = (weights / weights.sum(-1, keepdims=True)).mean(0)[:-1]
    rows = np.argsort(-mean, kind="stable")[:target - 1]
    return np.sort(positions[:, rows], axis=-1)


def test_tova_after_a_per_head_eviction_reads_the_prefills_row_order() -> None:
    """prefill_decoding(snapkv,tova), as kvpress: SnapKV keeps different tokens per key/value head, in torch.topk's
    order; TOVA's first decoding compression scores row i by the mean over all query heads and drops row i in every
    head, so the rows' order decides which tokens it drops (listed in position order instead, others go): why a
    near-tie in the prefill's scores that spectra and kvpress break differently changes what is dropped later."""
    prefill, arrays = make_prefill(length=200, seed=2)
    press = run_presses(["prefill_decoding(snapkv,tova)"], compression_interval=1)["prefill_decoding(snapkv,tova)"]
    kept = press.compress(prefill, 0.5).kept
    assert kept.shape == (KV_HEADS, 100) and set(kept[0].tolist()) != set(kept[1].tolist())
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((count, DIM)) for count in (HEADS, KV_HEADS, KV_HEADS))  # the new token's
    dropped = []
    for positions in (kept.numpy(), np.sort(kept.numpy(), axis=-1)):
        index = torch.from_numpy(positions)[..., None].expand(-1, -1, DIM)
        key = torch.cat([torch.from_numpy(arrays["k"]).gather(1, index), torch.from_numpy(k)[:, None]], dim=1)
        value = torch.cat([torch.from_numpy(arrays["v"]).gather(1, index), torch.from_numpy(v)[:, None]], dim=1)
        rows = press.keep(0, torch.from_numpy(q)[:, None], key, value, DIM ** -0.5, 60).numpy()
        assert (rows[:, 0] == 100).all()  # the new token's row, kept first
        spectra = np.sort(np.take_along_axis(positions, rows[:, 1:], axis=1), axis=-1)
        np.testing.assert_array_equal(spectra, tova_step(positions, arrays, q, k, 60))
        dropped.append([sorted(set(head) - set(after)) for head, after in zip(positions.tolist(), spectra.tolist())])
    assert dropped[0] != dropped[1]
