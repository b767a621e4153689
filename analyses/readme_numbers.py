"""The values and claims of the documents' marked paragraphs, read from the runs of the commands beside them.

One renderer per `<!-- numbers: NAME -->` marker (analyses/readme.py finds the markers and runs the commands):
`needs` names the `spectra` commands whose runs it reads, in the order they stand in the code block, and `read`
turns those runs into a `slots.Rendered` — the values the paragraph's slots quote, formatted (counts and settings
from run.json, so the prose cannot say 8 sequences where the command ran 32), and the claims it decides: each
interpretation the prose makes ("knorm beats random eviction at every ratio"), True or False on these runs. The
prose itself stays in the documents; a renderer never writes a sentence, so a claim that stops holding fails
`readme.py --check` instead of rewording itself.

The registry and the front page's renderers are here; the docs pages' are in readme_approx.py and
readme_decoders.py, docs/cache.md's task paragraphs' in readme_tasks.py, the axis paragraphs' (which axis each head
loses least, the mixed plan on tasks) in readme_axes.py, the leaderboard's comparisons of set-ups (noise against prose, the question in view
against one compression for many) in readme_boards.py, and what they share (formatting, reading runs) in
readme_values.py. The paragraphs of the report pages (the leaderboard, many questions, a task run's scores) are
rendered by the pages themselves (`spectra.pages`): each page names the markers it fills (`Page.paragraphs`), and
`page_renderers` makes their renderers from the registry, so no page is listed here by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import spectra
from readme_approx import (minilm_fastformer, minilm_fitted, minilm_k_needed, minilm_plan, minilm_scaling,
                           smollm2_fastformer, smollm2_scaling, speed_line, theorems_synthetic)
from readme_axes import axes_summary, smollm2_axes
from readme_boards import leaderboard_haystacks, leaderboard_in_view
from readme_models import leaderboard_bridge, leaderboard_models
from readme_decoders import heads_model, smollm2_cache, smollm2_cache_spectral, smollm2_decoder, smollm2_keys
from readme_tasks import smollm2_tasks, tasks_vs_nll
from readme_values import RenderError, Runs, only, sink_layers, two
from slots import Rendered
from spectra.errors import SpectraError
from spectra.pages import PAGES, Page
from spectra.report import equality
from spectra.report.evaluate import TaskRun
from spectra.report.summaries import c_at, headline, metric_grid

#: the committed comparisons with kvpress 0.5.5 the leaderboard's column `= kvpress (cells)` reads (`report.equality`)
EQUALITY = Path(__file__).resolve().parent.parent / equality.TABLE


@dataclass(frozen=True)
class Renderer:
    """`needs`: the spectra commands (analyze, approx, plan-k, …) whose runs the paragraph quotes, in block order;
    `read`: the paragraph's values and claims, from a map command → its runs (loaded) or, for plan-k, the plan."""

    needs: tuple[str, ...]
    read: Callable[[Runs], Rendered]


# ---------------------------------------------------------------- the front page


def front_figure1(runs: Runs) -> Rendered:
    """Figure 1's numbers on one run beside the paper's: the heatmap's range at n/4 and the layer trend."""
    run = only(runs, "analyze")
    numbers = headline(run, run.n // 4)
    return Rendered({"model": run.meta["model"]["name"], "n": str(run.n), "sequences": str(numbers["sequences"]),
                     "at": str(numbers["at"]), "c_min": two(numbers["c_min"]), "c_max": two(numbers["c_max"]),
                     "rho": two(numbers["layer_rho"])},
                    {"higher-layers-lower-rank": numbers["layer_rho"] > 0,
                     "below-paper-range": numbers["c_min"] < 0.88})


def front_heatmap(runs: Runs) -> Rendered:
    """A decoder's c at n/4 and sink mass per layer and head: where the sinks are and how skewed those heads are."""
    run = only(runs, "analyze")
    at = run.n // 4
    grid, sink = c_at(run, at), metric_grid(run, "sink_mean")
    sinking = sink > 0.5
    if not sinking.any() or sinking.all():
        raise RenderError(f"{run.path}: {'no' if not sinking.any() else 'every'} head puts more than half of its "
                          "attention on the first token, so there is nothing to compare")
    return Rendered({"model": run.meta["model"]["name"], "n": str(run.n), "sequences": str(run.meta["samples"]),
                     "at": str(at), "heads": str(sink.size), "sink_heads": str(int(sinking.sum())),
                     "c_sink": two(float(grid[sinking].mean())), "c_other": two(float(grid[~sinking].mean())),
                     **sink_layers(run)},
                    {"sink-heads-more-skewed": bool(grid[sinking].mean() > grid[~sinking].mean()),
                     "sinks-mostly-late": bool(sinking[run.layers // 2:].sum() > sinking[:run.layers // 2].sum())})


# ---------------------------------------------------------------- the report pages' paragraphs


def read_page(page: Page, view: str, runs: Runs) -> Rendered:
    """Paragraph `view` of `page` on the block's task runs of the page's commands (the repository's kvpress
    comparisons where the page reads them); a page's one-line refusal is a RenderError."""
    found = [run for command in page.commands for run in runs.get(command, []) if isinstance(run, TaskRun)]
    if not found or (not page.pools and len(found) != 1):
        raise RenderError(f"the block must run `spectra {page.commands[0]}` on a task file "
                          f"{'at least once' if page.pools else 'once'}, got {len(found)} task runs")
    options = {"equality": str(EQUALITY)} if "equality" in page.options.__dataclass_fields__ else {}
    try:
        sheet = page.render(found, view, **options)
    except SpectraError as error:
        raise RenderError(str(error)) from None
    return Rendered(sheet.values, sheet.claims)


def page_renderers() -> dict[str, Renderer]:
    """The renderer of every paragraph a registered page fills (`Page.paragraphs`: marker → view)."""
    return {paragraph: Renderer(page.commands, partial(read_page, page, view))
            for page in PAGES.values() for paragraph, view in page.paragraphs.items()}


RENDERERS: dict[str, Renderer] = {
    "front-figure1": Renderer(("analyze",), front_figure1),
    "front-heatmap": Renderer(("analyze",), front_heatmap),
    "tasks-vs-nll": Renderer(("cache", "cache", "cache"), tasks_vs_nll),
    "axes-summary": Renderer(("heads", "cache"), axes_summary),
    "smollm2-decoder": Renderer(("analyze", "approx"), smollm2_decoder),
    "smollm2-keys": Renderer(("analyze",), smollm2_keys),
    "minilm-fitted": Renderer(("approx",), minilm_fitted),
    "minilm-plan": Renderer(("analyze", "plan-k", "approx"), minilm_plan),
    "minilm-fastformer": Renderer(("approx",), minilm_fastformer),
    "smollm2-fastformer": Renderer(("approx",), smollm2_fastformer),
    "minilm-scaling": Renderer(("scaling",), minilm_scaling),
    "smollm2-scaling": Renderer(("scaling",), smollm2_scaling),
    "minilm-k-needed": Renderer(("scaling",), minilm_k_needed),
    "theorems-synthetic": Renderer(("theorems",), theorems_synthetic),
    "speed-line": Renderer(("analyze",), speed_line),
    "heads-minilm": Renderer(("approx", "heads"), heads_model),
    "heads-smollm2": Renderer(("approx", "heads"), heads_model),
    "smollm2-cache": Renderer(("cache",), smollm2_cache),
    "smollm2-cache-spectral": Renderer(("cache",), smollm2_cache_spectral),
    "smollm2-tasks": Renderer(("cache", "cache"), smollm2_tasks),
    "smollm2-axes": Renderer(("heads", "cache"), smollm2_axes),
    "leaderboard-haystacks": Renderer(("evaluate",), leaderboard_haystacks),
    "leaderboard-in-view": Renderer(("evaluate",), leaderboard_in_view),
    "leaderboard-bridge": Renderer(("analyze", "evaluate"), leaderboard_bridge),
    "leaderboard-bridge-gemma": Renderer(("analyze", "evaluate"), leaderboard_bridge),
    "leaderboard-models": Renderer(("evaluate",), leaderboard_models),
    **page_renderers(),
}


def loaded(arguments: list[str], out: Path | None, work: Path):
    """What a renderer reads of one command: its run loaded back, or for plan-k the plan JSON it wrote."""
    if arguments[0] == "plan-k":
        if "--out" not in arguments:
            raise RenderError("give the plan-k command an --out file, which the approx command beside it reads")
        return json.loads((work / arguments[arguments.index("--out") + 1]).read_text())
    if out is None:
        raise RenderError(f"`spectra {' '.join(arguments)}` wrote no run directory")
    try:
        return spectra.load_run(out)
    except SpectraError as error:  # a damaged run or published folder: one line
        raise RenderError(str(error)) from None


def render(name: str, ran: list[tuple[list[str], Path | None]], work: Path) -> Rendered:
    """The values and claims of paragraph `name` from the commands that ran beside it ((arguments, run
    directory) each)."""
    renderer = RENDERERS[name]
    runs: Runs = {}
    for arguments, out in ran:
        if arguments[0] in renderer.needs:
            runs.setdefault(arguments[0], []).append(loaded(arguments, out, work))
    missing = [command for command in dict.fromkeys(renderer.needs) if command not in runs]
    if missing:
        raise RenderError(f"the paragraph '{name}' quotes `spectra {missing[0]}`, which its code block does not run "
                          "(or which needs the Hub)")
    return renderer.read(runs)
