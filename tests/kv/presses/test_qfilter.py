"""`qfilter(DIR)` against numpy: kvpress 0.5.5's QFilterPress score −f·k of each cached key with its layer's and
key/value head's filter, on random tensors; the rows it keeps; the directory it reads (the layout kvpress's
`QFilters.from_pretrained` loads) and the filters it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.errors import SpectraError
from spectra.kv import artifacts
from spectra.kv.presses import REGISTRY, n_kept
from spectra.kv.presses.qfilter import QFilter, qfilter_scores

from .conftest import DIM, KV_HEADS, make_prefill

LAYERS = 3


def write_filters(folder, filters: np.ndarray):
    layers, kv_heads, dim = filters.shape
    return artifacts.write(folder, {"q_filters": torch.from_numpy(filters).float()},
                           {"num_layers": layers, "num_kv_heads": kv_heads, "kv_head_dim": dim})


def test_scores_are_minus_the_projection_on_the_layers_filter(tmp_path) -> None:
    filters = np.random.default_rng(4).standard_normal((LAYERS, KV_HEADS, DIM)).astype(np.float32)
    press = REGISTRY["qfilter"].bind(str(write_filters(tmp_path / "qf", filters)))
    assert press.name == f"qfilter({tmp_path / 'qf'})" and press.peer == "QFilterPress"
    for layer in range(LAYERS):
        prefill, arrays = make_prefill(length=80, seed=layer)
        prefill = type(prefill)(**{**prefill.__dict__, "layer": layer})
        expected = -np.einsum("hd,hld->hl", filters[layer].astype(np.float64), arrays["k"])
        got = press.score(prefill, 0.5)
        assert got.dtype == torch.float64, "scored in the cache's dtype"
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)  # filters stored in float32
        for ratio in (0.25, 0.5, 0.9):
            keep = n_kept(80, ratio)
            kept = press.compress(prefill, ratio).kept.numpy()
            np.testing.assert_array_equal(kept, np.sort(np.argsort(-expected, axis=-1, kind="stable")[:, :keep]))


def test_the_score_is_the_cache_dtypes_product() -> None:
    keys = torch.randn(KV_HEADS, 30, DIM)
    filters = torch.randn(KV_HEADS, DIM, dtype=torch.float64)
    got = qfilter_scores(keys, filters)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, -(keys.double() @ filters[..., None])[..., 0].float(), rtol=1e-5, atol=1e-5)


def test_filters_of_another_shape_are_refused(tmp_path) -> None:
    folder = write_filters(tmp_path / "qf", np.ones((LAYERS, KV_HEADS + 1, DIM), np.float32))
    prefill, _ = make_prefill()
    with pytest.raises(SpectraError, match="key/value heads"):
        REGISTRY["qfilter"].bind(str(folder)).score(prefill, 0.5)
    deep = write_filters(tmp_path / "deep", np.ones((1, KV_HEADS, DIM), np.float32))
    prefill = type(prefill)(**{**prefill.__dict__, "layer": 1})
    with pytest.raises(SpectraError, match="1 layers"):
        REGISTRY["qfilter"].bind(str(deep)).score(prefill, 0.5)
    with pytest.raises(ValueError, match=r"qfilter\(<directory>\)"):
        QFilter().score(prefill, 0.5)
    with pytest.raises(SpectraError, match="no such directory"):
        REGISTRY.resolve(f"qfilter({tmp_path / 'none'})")
