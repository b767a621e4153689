"""`merging(<scorer>)` against a numpy loop written here from kvpress 0.5.5's MergingPress: the scorer's kept tokens,
each evicted token's value folded into the kept token of its head with the most cosine-similar key, weighted by
max(cos, 0) · ‖v_e‖ / (‖v_e‖ + ‖v_t‖ + 1e-6), normalised by 1 + the weights a target received; keys untouched."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.merging import merge_values
from spectra.registry import PRESSES

from .conftest import make_prefill


def numpy_merging(keys: np.ndarray, values: np.ndarray, kept: np.ndarray, threshold: float = 0.0) -> np.ndarray:
    """(H_kv, m, d) the kept rows' values (kept: ascending positions per head) after every evicted row's merge, one
    evicted token at a time, in float64."""
    out = []
    for head in range(keys.shape[0]):
        evicted = np.setdiff1d(np.arange(keys.shape[1]), kept[head])
        unit = keys[head] / np.maximum(np.linalg.norm(keys[head], axis=-1, keepdims=True), 1e-6)
        base = values[head, kept[head]]
        added, weight = np.zeros_like(base), np.zeros(len(kept[head]))
        for e in evicted:
            cosines = unit[kept[head]] @ unit[e]
            t = int(np.argmax(cosines))
            if cosines[t] < threshold:
                continue
            own, theirs = np.linalg.norm(values[head, e]), np.linalg.norm(base[t])
            w = max(cosines[t], 0.0) * own / (own + theirs + 1e-6)
            added[t] += w * values[head, e]
            weight[t] += w
        out.append(np.where(weight[:, None] > 0, (base + added) / (1 + weight[:, None]), base))
    return np.stack(out)


def kept_by(scores: np.ndarray, keep: int) -> np.ndarray:
    return np.sort(np.argsort(-scores, axis=-1, kind="stable")[:, :keep], axis=-1)


@pytest.mark.parametrize("scorer", ["knorm", "keydiff", "snapkv", "observed"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_the_scorers_tokens_with_the_evicted_values_merged_in(scorer, ratio) -> None:
    prefill, arrays = make_prefill(length=100, seed=2)
    part = REGISTRY[f"merging({scorer})"].compress(prefill, ratio)
    keep = n_kept(100, ratio)
    alone = REGISTRY[scorer].compress(prefill, ratio)
    np.testing.assert_array_equal(part.kept.numpy(), alone.kept.numpy(), err_msg="the scorer's kept tokens")
    assert part.saved == alone.saved == 1 - keep / 100 and part.key is None, "keys kept as the prefill cached them"
    expected = numpy_merging(arrays["k"], arrays["v"], part.kept.numpy())
    np.testing.assert_allclose(part.value.numpy(), expected, rtol=1e-6, atol=1e-6)  # float32 accumulation
    keys, values = part.rows(prefill.key, prefill.value)
    assert torch.equal(keys, alone.rows(prefill.key, prefill.value)[0])
    changed = ~np.isclose(values.numpy(), alone.rows(prefill.key, prefill.value)[1].numpy()).all(-1)
    assert changed.any(), "kept values absorb evicted ones"
    assert part.counts().tolist() == [keep, keep]


def test_a_value_merges_into_the_kept_token_its_key_points_with_and_only_where_similar() -> None:
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [-1.0, 0.0]]])  # token 2 like 0; 3 opposite both
    values = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 3.0], [5.0, 5.0]]])
    merged = merge_values(keys, values, torch.tensor([[1, 0]]))  # listed as kept lists them: token 1 then 0
    cos = 0.9 / np.hypot(0.9, 0.1)
    w = cos * 3.0 / (3.0 + 1.0 + 1e-6)  # token 3's best cosine is 0 (with token 1): weight 0, no merge
    np.testing.assert_allclose(merged[0].numpy(), [[0.0, 1.0], [1 / (1 + w), 3 * w / (1 + w)]], rtol=1e-6)
    stricter = merge_values(keys, values, torch.tensor([[0, 1]]), threshold=0.999)
    assert torch.equal(stricter, values[:, :2]), "below the similarity threshold nothing merges"
    assert torch.equal(merge_values(keys, values, torch.tensor([[0, 1, 2, 3]])), values), "nothing evicted"


def test_a_fraction_merges_only_the_most_similar_evicted_tokens() -> None:
    keys = torch.tensor([[[1.0, 0.0], [0.99, 0.14], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]]])
    values = torch.arange(10.0).view(1, 5, 2) + 1
    kept = torch.tensor([[0]])
    half = merge_values(keys, values, kept, fraction=0.5)  # the quantile at ½ of cosines (.99, .8, .6, 0): 0.7
    unit = keys[0] / keys[0].norm(dim=-1, keepdim=True)
    cos = (unit[1:] @ unit[0]).numpy()
    norms = values[0].norm(dim=-1).numpy()
    w = cos[:2] * norms[1:3] / (norms[1:3] + norms[0] + 1e-6)
    expected = (values[0, 0].numpy() + w @ values[0, 1:3].numpy()) / (1 + w.sum())
    np.testing.assert_allclose(half[0, 0].numpy(), expected, rtol=1e-6)


def test_the_cache_dtype_is_kept() -> None:
    prefill, _ = make_prefill(length=40, seed=1)
    single = dataclasses.replace(prefill, key=prefill.key.float(), value=prefill.value.float())
    part = REGISTRY["merging(knorm)"].compress(single, 0.5)
    assert part.value.dtype == torch.float32 and part.value.shape == (2, 20, 8)


def test_bad_input_and_facts() -> None:
    with pytest.raises(SpectraError, match="merging wraps a scorer press, and 'think' is not one"):
        PRESSES.resolve("merging(think)")
    with pytest.raises(ValueError, match="needs a scorer press"):
        REGISTRY["merging"].compress(make_prefill()[0], 0.5)
    assert REGISTRY["merging(snapkv)"].windowed and REGISTRY["merging(observed)"].reads == ("received",)
    assert REGISTRY["merging"].peer == "MergingPress" and REGISTRY["merging(loki)"].calibrates
