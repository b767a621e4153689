"""`spectra analyze`: the singular spectra of P for every layer and head, averaged over sequences (the paper's
Figure 1), with the query/key/value spectra of decoders.

Probes: `SpectrumProbe` (behind `Offloaded`, which decides where and when the spectra run) and, for decoders or on
request, `QKVProbe`. Tables: metrics.csv (one row per layer and head), qkv.csv; arrays: curves.npz,
bootstrap.npz. Loads as `runs.Run`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import checkpoints
from ..config import Device, Place, RunConfig, choose, indices
from ..errors import SpectraError, spell
from ..options import identity, option
from ..reporter import Reporter
from .base import Analysis, check_selection, register


@dataclass(frozen=True)
class AnalyzeOptions:
    """What `spectra analyze` measures. `spectrum_device` and `overlap` change the speed, never the numbers."""

    at: int | None = option(None, "1-based singular-value index for c@index and the heatmap (default n/4: 128 for "
                            "n = 512).")
    spectrum_device: Place = option(Place.AUTO, "Where the singular values are computed: auto (GPU models: the "
                                    "batched cuSOLVER route where it can run and n > 32, else time the first layer "
                                    "on the GPU and on the CPU and keep the faster; CPU/MPS models: cpu), cpu, same "
                                    "(torch's solvers on the model's device), or cuda (the batched cuSOLVER route on "
                                    "the model's GPU). Speed only: within --spectrum-tolerance of the CPU's numbers.",
                                    identity=False)
    spectrum_tolerance: float = option(1e-6, "The largest error in c (c@index and every point of the curve) the "
                                       "batched GPU route may make, by its per-matrix bound: 1e-6 (exact, the other "
                                       "routes' bound), 1e-5 (float64), or ≥ 1e-4 to solve in float32 first (the "
                                       "matrices whose bound needs it are solved again in float64).", identity=False)
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
        tolerance = self.spectrum_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 1e-6 <= tolerance < 1:
            raise SpectraError(f"{spell('--spectrum-tolerance')} must be a number in [1e-6, 1) (the error in c the "
                               f"spectra may make; the exact routes' bound is 1e-6), got {tolerance!r}")
        object.__setattr__(self, "layers", indices(self.layers, "layer"))
        object.__setattr__(self, "heads", indices(self.heads, "head"))
        if self.bootstrap < 0:
            raise SpectraError(f"{spell('--bootstrap')} must be a number of replicates ≥ 0, got {self.bootstrap}")

    def resolved(self, n: int) -> AnalyzeOptions:
        """With `at` checked against n, or set to n/4."""
        if self.at is not None and not 1 <= self.at <= n:
            raise SpectraError(f"{spell('--at')} must be an index in 1…{n} (the sequence length), got {self.at}")
        return replace(self, at=self.at or max(1, n // 4))


class Analyze(Analysis):
    """Singular spectra of the context mapping matrix P for every layer and head, averaged over sequences."""

    name = "analyze"
    run_type = "Run"
    summary = "Singular spectra of the context mapping matrix P for every layer and head, averaged over sequences."
    options = AnalyzeOptions
    outputs = {"metrics.csv": ("layer", "head", "sequences"), "qkv.csv": ("tensor", "stage", "layer", "head")}

    def check(self, config: RunConfig, options: AnalyzeOptions, shape: checkpoints.Shape) -> None:
        super().check(config, options, shape)
        check_selection(options.layers, options.heads, shape)
        if options.spectrum_device == Place.CUDA:  # the batched route's device and library, before the model loads
            if config.device in (Device.CPU, Device.MPS):
                cuda = spell("--spectrum-device cuda", 'spectrum_device="cuda"')
                raise SpectraError(f"{cuda} runs on the model's CUDA device; use {spell('--device cuda')} or another "
                                   f"{spell('--spectrum-device')}")
            from .. import cusolver

            cusolver.require()

    def derived(self, options: AnalyzeOptions) -> tuple[str, ...]:
        return ("at",) if options.at is None else ()  # n/4 unless given

    def resolve(self, config: RunConfig, options: AnalyzeOptions) -> AnalyzeOptions:
        return options.resolved(config.length)

    def meta(self, config: RunConfig, options: AnalyzeOptions, source) -> dict[str, Any]:
        from ..spectrum import sink_start

        return {**identity(options), "qkv": self.wants_qkv(options, source), "sink_from": sink_start(config.length)}

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
        spectrum = SpectrumProbe(source.layers, source.heads, config.length, options.at,
                                 select_layers=options.layers, select_heads=options.heads,
                                 bootstrap=options.bootstrap, seed=config.seed)
        probes = {"spectrum": Offloaded(spectrum, options.spectrum_device, options.overlap, warn=reporter.warn,
                                        tolerance=options.spectrum_tolerance)}
        if self.wants_qkv(options, source):
            probes["qkv"] = QKVProbe(loaded.model, loaded.layers, loaded.heads, source.kv_heads, loaded.head_dim)
        return Probes(**probes)


register(Analyze())
