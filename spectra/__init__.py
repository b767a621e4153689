"""spectra: empirical spectral analysis of the attention of pretrained transformers."""

from .errors import SpectraError
from .pipeline import analyze
from .runs import Run, load_run

__all__ = ["SpectraError", "analyze", "load_run", "Run"]
