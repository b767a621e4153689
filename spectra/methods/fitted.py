"""`linformer-pca(s)`, `linformer-fit(s)`: eq. 7 with fixed projections learned from calibration sequences.

What a Linformer would use if its E, F were fitted to the frozen model rather than drawn at random:
`linformer-pca` takes the top principal directions of the keys' and values' positions, scaled by the best
factors (`nn.fit.pca_projections`); `linformer-fit` minimizes the head-output error by gradient descent,
from mean pooling, keeping the best step on held-out calibration sequences (`nn.fit.fit_projections`). Both
exist per sharing level. The projections are fitted before the evaluated sequences are read (`spectra approx
--fit-samples N`: the first N sequences calibrate, the next `--samples` evaluate), one set per budget, and
live on the run's own instance of the method. Eq. 7 mixes every key into each projected key, so neither can be
calibrated on (or stand in for) causal attention. Cost: that of eq. 7, O(n k d) per head, after a one-off fit.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..config import FitInit, Sharing
from ..nn.calibration import Calibration
from ..reporter import Reporter
from ..nn.descent import FitSettings, first_group_timer
from ..nn.fit import fit_projections, pca_projections
from ..nn.projections import Projections, projections_arrays, projections_from_arrays
from .base import Approximation, Calibrated, Draws, Layer, register
from .linformer import projected

#: what this file registers, read as text by `spectra.registry` without importing it (so `--help` needs no torch):
#: each name and its facts, and where the file's methods come in listings
ORDER = 110
DECLARES = {
    "linformer-pca(none)": {"family": "linformer-pca", "calibrates": True},
    "linformer-pca(headwise)": {"family": "linformer-pca", "calibrates": True},
    "linformer-pca(kv)": {"family": "linformer-pca", "calibrates": True},
    "linformer-pca(layerwise)": {"family": "linformer-pca", "calibrates": True},
    "linformer-fit(none)": {"family": "linformer-fit", "calibrates": True},
    "linformer-fit(headwise)": {"family": "linformer-fit", "calibrates": True},
    "linformer-fit(kv)": {"family": "linformer-fit", "calibrates": True},
    "linformer-fit(layerwise)": {"family": "linformer-fit", "calibrates": True},
}

#: plot colour, marker and terminal header of each family's sharing levels: PCA in blue-greens (matplotlib's PuBuGn),
#: the fit in greens (Greens), each level a shade; no colour within ΔE 20 (CIELAB) of another family's, so neither
#: is taken for the random Linformer's blues nor for pool-mean (tests/report/plots/test_style.py checks it)
SHOWN = {
    "linformer-pca": {Sharing.NONE: ("#66a9cf", "1", "pca\n(none)"), Sharing.HEADWISE: ("#16879f", "2", "pca\n(head)"),
                      Sharing.KV: ("#03657a", "3", "pca\n(kv)"), Sharing.LAYERWISE: ("#afc1dd", "4", "pca\n(layer)")},
    "linformer-fit": {Sharing.NONE: ("#73c476", "^", "fit\n(none)"), Sharing.HEADWISE: ("#2f974e", "v", "fit\n(head)"),
                      Sharing.KV: ("#005321", "D", "fit\n(kv)"), Sharing.LAYERWISE: ("#a9dca3", "P", "fit\n(layer)")},
}


class FittedLinformer(Calibrated):
    """Eq. 7 with the E, F this instance fitted at the budget asked, under one sharing level."""

    def __init__(self, sharing: Sharing, **shown: str) -> None:
        super().__init__(f"{self.family}({sharing})", **shown)
        self.sharing = sharing
        self.projections: dict[int, Projections] = {}

    def reset(self) -> None:
        self.projections = {}

    @property
    def fitted(self) -> bool:
        return bool(self.projections)

    def approximate(self, x: Layer, budget: int, draws: Draws) -> Approximation:
        projections = self.projections.get(budget)
        if projections is None:
            raise self.unfitted(budget)
        e, f = projections.pair(x.layer, x.q.shape[-2])
        return projected(x, e, f)

    def arrays(self) -> dict[str, np.ndarray]:
        return projections_arrays({(self.label, budget): projections for budget, projections in self.projections.items()})

    def load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        found = projections_from_arrays({key: value for key, value in arrays.items() if key.startswith(self.label + "|")})
        self.projections = {budget: projections for (_, budget), projections in found.items()}


class LinformerPCA(FittedLinformer):
    """E, F from the calibration's principal directions, scaled by the best factors (closed form)."""

    family = "linformer-pca"

    def fit(self, calibrations: Sequence[Calibration], *, layers: int, heads: int, n: int, settings: FitSettings,
            reporter: Reporter) -> pd.DataFrame:
        for budget in settings.budgets:
            self.projections[budget] = pca_projections(calibrations, layers, heads, budget, n, self.sharing)
        return pd.DataFrame()


class LinformerFit(FittedLinformer):
    """E, F fitted by Adam from mean pooling (or the PCA start), the best held-out step kept."""

    family = "linformer-fit"

    def fit(self, calibrations: Sequence[Calibration], *, layers: int, heads: int, n: int, settings: FitSettings,
            reporter: Reporter) -> pd.DataFrame:
        histories = []
        groups = 1 if self.sharing == Sharing.LAYERWISE else len(calibrations)
        for budget in settings.budgets:
            shape = (calibrations, layers, heads, budget, n, self.sharing)
            init = pca_projections(*shape) if settings.init == FitInit.PCA else None
            fit = fit_projections(*shape, init=init, steps=settings.steps, lr=settings.lr, seed=settings.seed,
                                  validation=settings.validation,
                                  progress=first_group_timer(reporter, f"{self.label} at k = {budget}", groups,
                                                             settings.steps))
            self.projections[budget] = fit.projections
            histories.append(fit.history.assign(budget=budget))
            kept = ", ".join(f"{step}" for step in fit.best_step.values())
            reporter.notify(f"fitted {self.label} at k = {budget}: kept step(s) {kept} of {settings.steps}")
        return pd.concat(histories, ignore_index=True) if histories else pd.DataFrame()


for _family, _class in (("linformer-pca", LinformerPCA), ("linformer-fit", LinformerFit)):
    for _sharing, (_color, _marker, _short) in SHOWN[_family].items():
        register(_class(_sharing, color=_color, marker=_marker, short=_short))
