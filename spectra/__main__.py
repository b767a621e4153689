"""`python -m spectra …` (and `torchrun … -m spectra …`) runs the command line."""

from .cli import main

main()
