"""Figures from finished runs: the paper's Figure 1, per-run views of analyze runs, and the views of approx,
theorems and scaling runs. Reads only run objects (or run directories), never models.

Every `draw_*` function returns a matplotlib Figure whose artists hold exactly the run's stored values, found by
their gid (tests read them back); the `plot_*` functions and `figure1` write PNG (200 dpi) and vector PDF next to
each other through `style.save`. The CLI's `--plot` looks the entry points up here by name.
"""

from __future__ import annotations

from .approx import (
                      draw_approx_budgets,
                      draw_approx_layers,
                      draw_end_to_end,
                      draw_plan_layers,
                      plot_approx,
)
from .figure1 import choose_heatmap, draw_figure1, figure1
from .scaling import draw_scaling_c, draw_scaling_ranks, plot_scaling
from .spectra import (
                      RunPlots,
                      draw_attention_heatmaps,
                      draw_c_heatmap,
                      draw_key_ranks,
                      draw_layer_curves,
                      draw_rank_heatmaps,
                      plot_run,
)
from .theorems import draw_theorem1, draw_theorem_errors, plot_theorems

__all__ = [
                      "RunPlots",
                      "choose_heatmap",
                      "draw_approx_budgets",
                      "draw_approx_layers",
                      "draw_attention_heatmaps",
                      "draw_c_heatmap",
                      "draw_end_to_end",
                      "draw_figure1",
                      "draw_key_ranks",
                      "draw_layer_curves",
                      "draw_plan_layers",
                      "draw_rank_heatmaps",
                      "draw_scaling_c",
                      "draw_scaling_ranks",
                      "draw_theorem1",
                      "draw_theorem_errors",
                      "figure1",
                      "plot_approx",
                      "plot_run",
                      "plot_scaling",
                      "plot_theorems",
]
