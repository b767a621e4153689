"""The fitted methods are eq. 7 with the projections handed to the layer: dense check with given (not pooled)
matrices, per sharing level; a missing fit says how to get one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layers import H, N, random_layer, softmax

from spectra.config import Sharing
from spectra.errors import SpectraError
from spectra.methods import REGISTRY
from spectra.methods.fitted import FITTED_FAMILIES, sharing_of
from spectra.nn.projections import Projections


@pytest.mark.parametrize("family", FITTED_FAMILIES)
@pytest.mark.parametrize("sharing", list(Sharing))
def test_fitted_method_is_eq7_with_the_given_projections(family, sharing) -> None:
    label, budget = f"{family}({sharing})", 4
    given = Projections(5, H, budget, N, sharing, seed=11, trainable=False)  # any fixed matrices stand in for a fit
    x = random_layer(lengths=(N, 7), fitted={(label, budget): given})
    approx = REGISTRY[label].run(x, budget)
    e, f = given.pair(x.layer, N)
    assert sharing_of(label) == sharing
    for b, m in enumerate((N, 7)):
        for h in range(H):
            ek = e[h, :, :m].double().numpy() @ x.k[b, h, :m].numpy()
            fv = f[h, :, :m].double().numpy() @ x.v[b, h, :m].numpy()
            want = softmax(x.q[b, h, :m].numpy() @ ek.T * 0.7) @ fv
            assert np.allclose(approx.out[b, h, :m].numpy(), want, atol=1e-6), (b, h)


def test_a_fitted_method_without_its_fit_names_the_option() -> None:
    x = random_layer(fitted={})
    with pytest.raises(SpectraError, match="pass fit_samples=N to spectra.approx") as raised:
        REGISTRY["linformer-fit(kv)"].run(x, 3)
    assert raised.value.for_cli().endswith("pass --fit-samples N to spectra approx")
    assert torch.isfinite(REGISTRY["linformer-fit(kv)"].run(random_layer(), 3).out).all(), "pooled stand-in works"
