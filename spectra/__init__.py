"""spectra: empirical spectral analysis of the attention of pretrained transformers.

The three analyses share one loop (pipeline.py): `analyze` (singular spectra of P), `approx` (how well
cheap attentions stand in at a budget k) and `theorems` (the Linformer paper's JL theorems against
reality). Runs load back with `load_run`; figures are in `spectra.plots`.
"""

from .errors import SpectraError
from .pipeline import analyze, approx, theorems
from .runs import ApproxRun, Run, TheoremRun, load_run

__all__ = ["SpectraError", "analyze", "approx", "theorems", "load_run", "Run", "ApproxRun", "TheoremRun"]
