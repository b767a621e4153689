"""`spectra analyze`: the singular spectra of P for every layer and head, averaged over sequences (the paper's
Figure 1), with the query/key/value spectra of decoders.

Probes: `SpectrumProbe` (behind `Offloaded`, which decides where and when the spectra run) and, for decoders or on
request, `QKVProbe`. Tables: metrics.csv (one row per layer and head), qkv.csv; arrays: curves.npz,
bootstrap.npz. Loads as `runs.Run`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import checkpoints
from ..config import Place, RunConfig, choose, indices
from ..errors import SpectraError
from ..errors import option as spell
from ..options import identity, option
from ..reporter import Reporter
from ..runs import Run, read_arrays, read_table
from .base import Analysis, register


@dataclass(frozen=True)
class AnalyzeOptions:
    """What `spectra analyze` measures. `spectrum_device` and `overlap` change the speed, never the numbers."""

    at: int | None = option(None, "1-based singular-value index for c@index and the heatmap (default n/4: 128 for "
                            "n = 512).")
    spectrum_device: Place = option(Place.AUTO, "Where the singular values are computed: auto (GPU models: time the "
                                    "first layer on the GPU and on the CPU, keep the faster; CPU/MPS models: cpu), "
                                    "cpu, or same (the model's device). Speed only: the numbers change by rounding "
                                    "at most.", identity=False)
    overlap: bool | None = option(None, "Compute the spectra on a background thread while the forward pass goes on "
                                  "(default: when they run off the model's device).", negative="--no-overlap",
                                  identity=False)
    qkv: bool | None = option(None, "Also the spectra of queries, keys and values (before and after RoPE): rank for "
                              "90%/99% of the energy per sequence and over the run (default: on for decoders).",
                              negative="--no-qkv")
    layers: tuple[int, ...] | None = option(None, "Spectra of these layers only, e.g. 0,14,29 or 0-5 (long "
                                            "sequences: each spectrum costs O(n³)).")
    heads: tuple[int, ...] | None = option(None, "Spectra of these heads only, e.g. 0-3.")
    bootstrap: int = option(0, "Keep this many Poisson-bootstrap replicates over sequences of the mean ranks (for "
                            "confidence intervals; spectra scaling uses them).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "spectrum_device", choose(Place, self.spectrum_device, "--spectrum-device"))
        object.__setattr__(self, "layers", indices(self.layers, "layer"))
        object.__setattr__(self, "heads", indices(self.heads, "head"))
        if self.bootstrap < 0:
            raise SpectraError(f"{spell('--bootstrap')} must be a number of replicates ≥ 0, got {self.bootstrap}")

    def resolved(self, n: int) -> AnalyzeOptions:
        """With `at` checked against n, or set to n/4."""
        if self.at is not None and not 1 <= self.at <= n:
            raise SpectraError(f"{spell('--at')} must be an index in 1…{n} (the sequence length), got {self.at}")
        return replace(self, at=self.at or max(1, n // 4))


def check_selection(layers: tuple[int, ...] | None, heads: tuple[int, ...] | None,
                    shape: checkpoints.Shape) -> None:
    """Chosen layers and heads must exist in the model (checked when its shape is known)."""
    for chosen, count, name in ((layers, shape.layers, "--layers"), (heads, shape.heads, "--heads")):
        if chosen is not None and count is not None and (chosen[0] < 0 or chosen[-1] >= count):
            raise SpectraError(f"{spell(name)} must lie in 0…{count - 1} for {shape.name}, got {list(chosen)}")


class Analyze(Analysis):
    """Singular spectra of the context mapping matrix P for every layer and head, averaged over sequences."""

    name = "analyze"
    summary = "Singular spectra of the context mapping matrix P for every layer and head, averaged over sequences."
    options = AnalyzeOptions
    outputs = {"metrics.csv": ("layer", "head", "sequences"), "qkv.csv": ("tensor", "stage", "layer", "head")}

    def check(self, config: RunConfig, options: AnalyzeOptions, shape: checkpoints.Shape) -> None:
        super().check(config, options, shape)
        check_selection(options.layers, options.heads, shape)

    def job(self, config: RunConfig, options: AnalyzeOptions, reporter: Reporter, found: checkpoints.Source):
        from ..loop import Job
        from ..spectrum import sink_start

        derived = ("at",) if options.at is None else ()  # n/4 unless given
        options = options.resolved(config.length)
        return Job("analyze", config, config.settings(identity(options)), config.samples,
                   config.default_out("analyze", found.label), found.where,
                   open_source=lambda where: model_source(config, where),
                   build_probe=lambda source: self.probe(config, options, reporter, source),
                   meta=lambda source: {**identity(options), "qkv": self.wants_qkv(options, source),
                                        "sink_from": sink_start(config.length)}, derived=derived)

    @staticmethod
    def wants_qkv(options: AnalyzeOptions, source) -> bool:
        """The q/k/v spectra run when asked, and by default on decoders."""
        return bool(options.qkv or (options.qkv is None and source.loaded.causal))

    def probe(self, config: RunConfig, options: AnalyzeOptions, reporter: Reporter, source):
        """The spectrum probe (and the q/k/v probe of decoders), once the model has loaded."""
        from ..probes import Probes
        from ..probes.offload import Offloaded
        from ..probes.qkv import QKVProbe
        from ..probes.spectrum import SpectrumProbe

        loaded = source.loaded
        self.check(config, options, source.shape())
        spectrum = SpectrumProbe(source.layers, source.heads, config.length, options.at,
                                 select_layers=options.layers, select_heads=options.heads,
                                 bootstrap=options.bootstrap, seed=config.seed)
        probes = {"spectrum": Offloaded(spectrum, options.spectrum_device, options.overlap, warn=reporter.warn)}
        if self.wants_qkv(options, source):
            probes["qkv"] = QKVProbe(loaded.model, loaded.layers, loaded.heads, source.kv_heads, loaded.head_dim)
        return Probes(**probes)

    def load(self, path: Path, meta: dict[str, Any]) -> Run:
        curves = read_arrays(path / "curves.npz")
        qkv = read_table(path, "qkv.csv", optional=True)
        return Run(path, meta, read_table(path, "metrics.csv"), curves["cum_mean"], curves["cum_std"],
                   curves["sigma_mean"], curves["sigma_std"], qkv)

    def show(self, run: Run) -> None:
        from ..report.console import print_analyze

        print_analyze(run)

    def plot(self, run: Run, out: str | Path | None = None) -> list[Path]:
        from ..report.plots.spectra import plot_run

        return plot_run(run, out).paths


def model_source(config: RunConfig, where: Any, **options: Any):
    """The corpus read through the model (`sources.ModelSource`), imported when a run starts."""
    from ..sources import ModelSource

    return ModelSource(config, where, **options)


register(Analyze())
