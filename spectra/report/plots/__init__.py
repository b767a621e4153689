"""What the figures share: `style` (colours, markers, titles, heatmaps, axes, saving PNG and PDF through
`style.save`), the paper's Figure 1 (`figure1`), drawn from several analyze runs, and the task study's score figure
(`scores`), read with every press of the default list. Each analysis draws its own
figures in its read side (`spectra/report/<kind>.py`); they read only run objects, never models.

Every `draw_*` function returns a matplotlib Figure whose artists hold exactly the run's stored values, found by
their gid (tests read them back); the `plot_*` functions and `figure1` write PNG (200 dpi) and vector PDF next to
each other through `style.save`.
"""

from __future__ import annotations

from .figure1 import choose_heatmap, draw_figure1, figure1

__all__ = ["choose_heatmap", "draw_figure1", "figure1"]
