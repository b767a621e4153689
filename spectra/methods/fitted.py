"""`linformer-pca(s)`, `linformer-fit(s)`: eq. 7 with fixed projections learned from calibration sequences.

What a Linformer would use if its E, F were fitted to the frozen model rather than drawn at random:
`linformer-pca` takes the top principal directions of the keys' and values' positions, scaled by the best
factors (`nn.fit.pca_projections`); `linformer-fit` minimizes the head-output error by gradient descent,
from mean pooling, keeping the best step on held-out calibration sequences (`nn.fit.fit_projections`). Both
exist per sharing level. The projections are fitted before the evaluated sequences are read (`spectra approx
--fit-samples N`: the first N sequences calibrate, the next `--samples` evaluate) and reach the method through
`Layer.fitted`. Cost: that of eq. 7, O(n k d) per head, after a one-off fit.
"""

from __future__ import annotations

from ..config import Sharing
from ..errors import SpectraError, option
from .base import Approximation, Layer, Method, register
from .linformer import eq7

#: plot colour, marker and terminal header of each family's sharing levels: PCA in blue-greens (matplotlib's PuBuGn),
#: the fit in greens (Greens), each level a shade; no colour within ΔE 20 (CIELAB) of another family's, so neither
#: is taken for the random Linformer's blues nor for pool-mean (tests/methods/test_base.py checks it)
_SHOWN = {
    "linformer-pca": {Sharing.NONE: ("#66a9cf", "1", "pca\n(none)"), Sharing.HEADWISE: ("#16879f", "2", "pca\n(head)"),
                      Sharing.KV: ("#03657a", "3", "pca\n(kv)"), Sharing.LAYERWISE: ("#afc1dd", "4", "pca\n(layer)")},
    "linformer-fit": {Sharing.NONE: ("#73c476", "^", "fit\n(none)"), Sharing.HEADWISE: ("#2f974e", "v", "fit\n(head)"),
                      Sharing.KV: ("#005321", "D", "fit\n(kv)"), Sharing.LAYERWISE: ("#a9dca3", "P", "fit\n(layer)")},
}
FITTED_FAMILIES = tuple(_SHOWN)


def sharing_of(label: str) -> Sharing:
    """The sharing level in a label such as linformer-fit(kv)."""
    return Sharing(label[label.index("(") + 1:-1])


def fitted_method(label: str) -> Method:
    """Eq. 7 with the projections fitted for `label` at the budget asked."""

    def fitted(x: Layer, budget: int) -> Approximation:
        projections = (x.fitted or {}).get((label, budget))
        if projections is None:
            raise SpectraError(f"{label} at k = {budget} needs projections fitted on calibration sequences: pass "
                               f"{option('--fit-samples N', 'fit_samples=N')} to "
                               f"{option('spectra approx', 'spectra.approx')}")
        e, f = projections.pair(x.layer, x.q.shape[-2])
        return eq7(x, e, f)

    return fitted


for _family, _levels in _SHOWN.items():
    for _sharing, (_color, _marker, _short) in _levels.items():
        _label = f"{_family}({_sharing})"
        register(_label, fitted_method(_label), family=_family, color=_color, marker=_marker, short=_short,
                 calibrates=True)
