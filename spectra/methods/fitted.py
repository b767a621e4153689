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

#: where this file's methods come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 110


class FittedLinformer(Calibrated):
    """Eq. 7 with the E, F this instance fitted at the budget asked, under one sharing level. Each family's variants
    (one per sharing level) carry a plot colour, marker and terminal header: PCA in blue-greens (matplotlib's
    PuBuGn), the fit in greens (Greens), each level a shade; no colour within ΔE 20 (CIELAB) of another family's, so
    neither is taken for the random Linformer's blues nor for pool-mean (tests/report/plots/test_style.py checks it)."""

    def __init__(self, label: str, sharing: Sharing, **shown: str) -> None:
        super().__init__(label, **shown)
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


@register
class LinformerPCA(FittedLinformer):
    """E, F from the calibration's principal directions, scaled by the best factors (closed form)."""

    family = "linformer-pca"
    variants = {
        "linformer-pca(none)": {"sharing": Sharing.NONE, "color": "#66a9cf", "marker": "1", "short": "pca\n(none)"},
        "linformer-pca(headwise)": {"sharing": Sharing.HEADWISE, "color": "#16879f", "marker": "2",
                                    "short": "pca\n(head)"},
        "linformer-pca(kv)": {"sharing": Sharing.KV, "color": "#03657a", "marker": "3", "short": "pca\n(kv)"},
        "linformer-pca(layerwise)": {"sharing": Sharing.LAYERWISE, "color": "#afc1dd", "marker": "4",
                                     "short": "pca\n(layer)"},
    }

    def fit(self, calibrations: Sequence[Calibration], *, layers: int, heads: int, n: int, settings: FitSettings,
            reporter: Reporter) -> pd.DataFrame:
        for budget in settings.budgets:
            self.projections[budget] = pca_projections(calibrations, layers, heads, budget, n, self.sharing)
        return pd.DataFrame()


@register
class LinformerFit(FittedLinformer):
    """E, F fitted by Adam from mean pooling (or the PCA start), the best held-out step kept."""

    family = "linformer-fit"
    variants = {
        "linformer-fit(none)": {"sharing": Sharing.NONE, "color": "#73c476", "marker": "^", "short": "fit\n(none)"},
        "linformer-fit(headwise)": {"sharing": Sharing.HEADWISE, "color": "#2f974e", "marker": "v",
                                    "short": "fit\n(head)"},
        "linformer-fit(kv)": {"sharing": Sharing.KV, "color": "#005321", "marker": "D", "short": "fit\n(kv)"},
        "linformer-fit(layerwise)": {"sharing": Sharing.LAYERWISE, "color": "#a9dca3", "marker": "P",
                                     "short": "fit\n(layer)"},
    }

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
