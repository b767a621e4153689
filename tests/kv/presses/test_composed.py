"""`composed(a,b,…)` against numpy: kvpress 0.5.5's ComposedPress applies its presses in turn, each scoring the
rows the one before kept, in the order its cache holds them (a scorer's torch.topk order); the window attention of
a press after another is formed again over the kept keys; the memory saved is 1 − Π(1 − saved_i); bad forms are
refused in one line before anything loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.inputs import items
from spectra.kv.presses import REGISTRY, run_presses
from spectra.kv.presses.composed import Composed
from spectra.registry import PRESSES, press_names

from .conftest import make_prefill


def topk_rows(scores: np.ndarray, keep: int) -> np.ndarray:
    """The `keep` highest-scoring rows of each head, best first (torch.topk's order on distinct scores)."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :keep]


def numpy_snapkv(q: np.ndarray, keys: np.ndarray, scaling: float, window: int = 64, kernel: int = 5) -> np.ndarray:
    """kvpress's SnapKV score of the cache `keys` (H_kv, m, d) from the last `window` queries q (H, window, d):
    softmax over all m keys with the window's causal mask on the last `window` columns, mean over the window,
    average-pooled (zero padding counted), mean over each group, the window scored max + 1."""
    groups = q.shape[0] // keys.shape[0]
    repeated = np.repeat(keys, groups, axis=0)
    scores = np.einsum("hwd,hmd->hwm", q, repeated) * scaling
    rows = keys.shape[1]
    hidden = np.triu(np.ones((window, window), bool), 1)
    scores[..., rows - window:][:, hidden] = -np.inf
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    weights = scores / scores.sum(-1, keepdims=True)
    mean = weights[..., : rows - window].mean(axis=1)
    padded = np.pad(mean, ((0, 0), (kernel // 2, kernel // 2)))
    pooled = np.stack([padded[:, j:j + kernel].mean(-1) for j in range(rows - window)], axis=-1)
    grouped = pooled.reshape(keys.shape[0], groups, -1).mean(1)
    return np.concatenate([grouped, np.full((keys.shape[0], window), grouped.max() + 1)], axis=-1)


@pytest.mark.parametrize("ratio", [0.25, 0.4])  # SnapKV keeps more than its 64 tied window rows: no ties
def test_knorm_then_snapkv_scores_the_rows_knorm_kept_in_its_order(ratio) -> None:
    prefill, arrays = make_prefill(length=300, seed=3)
    first = max(1, int(300 * (1 - ratio)))
    kept1 = topk_rows(-np.linalg.norm(arrays["k"], axis=-1), first)  # knorm's rows, best first
    keys1 = np.take_along_axis(arrays["k"], kept1[..., None], axis=1)
    second = max(1, int(first * (1 - ratio)))
    kept2 = topk_rows(numpy_snapkv(arrays["q"][:, -64:], keys1, prefill.scaling), second)
    expected = np.take_along_axis(kept1, kept2, axis=1)
    compressed = REGISTRY["composed(knorm,snapkv)"].compress(prefill, ratio)
    np.testing.assert_array_equal(np.sort(compressed.kept.numpy(), -1), np.sort(expected, -1))
    assert compressed.key is None and compressed.value is None and compressed.start is None
    assert compressed.saved == pytest.approx(1 - (first / 300) * (second / first))


def test_snapkv_then_streaming_keeps_the_first_rows_of_snapkvs_order() -> None:
    """StreamingLLM after SnapKV protects the first 4 rows of SnapKV's cache — its best-scored ones, not the
    context's first tokens (kvpress's gather order), and the most recent rows of that order."""
    prefill, arrays = make_prefill(length=200, seed=5)
    scores = numpy_snapkv(arrays["q"][:, -64:], arrays["k"], prefill.scaling)
    np.testing.assert_allclose(REGISTRY["snapkv"].score(prefill, 0.5).numpy(), scores, rtol=1e-10)
    kept1 = torch.topk(torch.from_numpy(scores), 100).indices.numpy()  # its 64 tied window rows in topk's order
    compressed = REGISTRY["composed(snapkv,streaming)"].compress(prefill, 0.5)
    for head in range(2):  # streaming keeps the rows 0–3 and 54–99 of the 100 SnapKV kept
        expected = sorted(kept1[head, [0, 1, 2, 3, *range(54, 100)]].tolist())
        assert sorted(compressed.kept[head].tolist()) == expected
    assert compressed.counts().tolist() == [50, 50]


def test_a_channel_press_last_gives_its_keys_of_the_kept_rows() -> None:
    prefill, _ = make_prefill(length=120, seed=2)
    rope = lambda positions: (torch.ones(len(positions), 8, dtype=torch.float64),  # noqa: E731
                              torch.zeros(len(positions), 8, dtype=torch.float64))
    prefill = type(prefill)(**{**prefill.__dict__, "key_pre": prefill.key, "rope": rope})
    alone = REGISTRY["knorm"].compress(prefill, 0.5)
    composed = REGISTRY["composed(knorm,think)"].compress(prefill, 0.5)
    np.testing.assert_array_equal(np.sort(composed.kept.numpy(), -1), alone.kept.numpy())
    thought = REGISTRY["think"].compress(prefill, 0.5)
    assert composed.key is not None and composed.key.shape == (2, 60, 8)
    zeroed = (composed.key == 0).all(dim=1).sum(-1)  # whole key channels pruned per head, as think prunes them
    assert zeroed.tolist() == (thought.key == 0).all(dim=1).sum(-1).tolist()
    assert composed.saved == pytest.approx(1 - 0.5 * (1 - thought.saved))


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_a_channel_press_first_stores_the_rows_kept_at_its_width(ratio) -> None:
    """Issue 38: composed(think,snapkv) keeps n_kept(L, r) rows whose keys lost think's pruned channels, so its cache
    stores per key/value head n_kept·(2d − p) numbers and think's channel mask — what composed(snapkv,think) stores
    too — and saves 1 − Π(1 − saved); before, its bytes counted the rows at full width, as if think had pruned
    nothing."""
    prefill, _ = make_prefill(length=200, seed=4)
    dim, itemsize, pruned = prefill.head_dim, prefill.key.element_size(), int(prefill.head_dim * ratio)
    kept = max(1, int(200 * (1 - ratio)))
    by_hand = kept * (2 * dim - pruned) * itemsize + -(-dim // 8)  # ThinK's rows and its bitmask of kept channels
    for name in ("composed(think,snapkv)", "composed(snapkv,think)"):
        compressed = REGISTRY[name].compress(prefill, ratio)
        assert compressed.counts().tolist() == [kept] * prefill.kv_heads
        assert compressed.memory(prefill).tolist() == [by_hand] * prefill.kv_heads, name
        assert compressed.saved == pytest.approx(1 - (1 - pruned / dim / 2) * (kept / 200))
        assert ((compressed.key == 0).all(dim=1).sum(-1) == pruned).all(), "think's channels stay pruned"


def test_a_transform_comes_last_only() -> None:
    prefill, _ = make_prefill(length=120, seed=2)
    with pytest.raises(ValueError, match="linformer's rows are no context tokens: in composed\\(linformer,knorm\\)"):
        Composed(REGISTRY["linformer"], REGISTRY["knorm"]).compress(prefill, 0.5)  # built past the registry
    last = REGISTRY["composed(knorm,linformer)"].compress(prefill, 0.5)
    assert last.kept is None and last.key is not None


def test_three_presses_and_the_run_copy() -> None:
    prefill, _ = make_prefill(length=200, seed=1)
    built = run_presses(["composed(knorm,keydiff,streaming)"], layers=4)["composed(knorm,keydiff,streaming)"]
    assert isinstance(built, Composed) and [press.name for press in built.inner] == ["knorm", "keydiff", "streaming"]
    compressed = built.compress(prefill, 0.5)
    assert compressed.counts().tolist() == [25, 25] and len(set(compressed.kept[0].tolist())) == 25
    facts = dict(PRESSES.facts("composed(snapkv,knorm)"))
    assert facts["windowed"] and facts["window"] == 64 and facts["peer"] == "ComposedPress"
    assert REGISTRY["composed(snapkv,knorm)"].windowed and not REGISTRY["composed(knorm,keydiff)"].windowed


def test_a_press_list_keeps_each_composed_press_whole() -> None:
    assert press_names(items("composed(snapkv, knorm),knorm", "--presses")) == ("composed(snapkv, knorm)", "knorm")


@pytest.mark.parametrize("name, message", [
    ("composed(snapkv)", "composed is written composed\\(<press>,<press>,\\.\\.\\.\\)$"),
    ("composed", "takes an argument: composed\\(<press>,<press>,\\.\\.\\.\\)$"),
    ("composed(snapkv,,knorm)", "has an empty argument"),
    ("composed(snapkv,observed)", "none that compresses while decoding, reads the attention each key received, "
                                  "runs a whole-model pass of its own \\(KVzip's reconstruction pass, KVCompose's "
                                  "replay pass, KVgrad's gradient pass\\) or is fitted on calibration text, and "
                                  "'observed' is not one: it reads the attention each key received; presses:"),
    ("composed(kvcompose,knorm)", "'kvcompose' is not one"),  # its replay pass never ran for a composed cell
    ("composed(kvzip,knorm)", "'kvzip' is not one"),
    ("composed(knorm,kvgrad)", "'kvgrad' is not one"),
    ("composed(knorm,loki)", "'loki' is not one"),
    ("composed(lowrank,snapkv)", "'lowrank' is not one"),  # it calibrates: a fit on other rows than those it finds
    ("composed(knorm,decoding(knorm))", "'decoding\\(knorm\\)' is not one"),
    ("composed(knorm,adakv(snapkv))", "'adakv\\(snapkv\\)' is not one"),
    ("composed(knorm,nope)", "'nope' is unknown"),
    ("composed(linformer,knorm)", "linformer's rows mix the context's tokens, .* put linformer last$"),
    ("composed(knorm,linformer,streaming)", "put linformer last$"),
])
def test_bad_forms_are_refused_in_one_line(name, message) -> None:
    with pytest.raises(SpectraError, match=message) as caught:
        press_names([name])
    assert "\n" not in str(caught.value)
    with pytest.raises(TypeError, match="composes two or more presses"):
        REGISTRY["composed"].bind(REGISTRY["knorm"])


@pytest.mark.parametrize(("name", "axis"), [("composed(snapkv,think)", "tokens+channels"),
                                            ("composed(think,snapkv)", "channels+tokens"),
                                            ("composed(snapkv,knorm)", "tokens"),
                                            ("composed(knorm,kivi4)", "tokens+bits")])
def test_the_axis_is_what_the_chain_removes(name, axis) -> None:
    """Before, every composition said `tokens`, even composed(think,snapkv), whose first press prunes key channels."""
    assert REGISTRY[name].axis == axis
